//! The official `openai` Python client (pip) streams a chat completion through the router.

use std::time::Duration;

use anyhow::{Context, Result};
use fleet_router::RouterConfig;
use fleet_sim::ModelConfig;
use fleet_test_support::spawn_sim;

use crate::support::router;

const CLIENT: &str = r#"
import sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", timeout=30, max_retries=0)
stream = client.chat.completions.create(
    model=sys.argv[2],
    messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}],
    max_tokens=12,
    stream=True,
)
pieces = []
finish = None
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.choices and chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
models = [m.id for m in client.models.list()]
print(f"chunks={len(pieces)} finish={finish} models={','.join(models)}")
"#;

#[tokio::test]
async fn the_openai_python_client_streams_a_chat_completion_through_the_router() -> Result<()> {
    let sim = spawn_sim(2, ModelConfig::default()).await?;
    let router = router(RouterConfig { replicas: sim.urls().to_vec(), ..RouterConfig::default() }).await?;
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .args(["-c", CLIENT, &router.url, fleet_sim::DEFAULT_MODEL])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("the python client hung")?
    .context("cannot run python3 (with `pip install openai`)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout.trim(), format!("chunks=12 finish=length models={}", fleet_sim::DEFAULT_MODEL));
    Ok(())
}
