//! fleet-router's integration tests: real fleet-sim replicas (in-process or as processes) and real HTTP
//! on 127.0.0.1 port 0. Process-based tests need the `fleet-sim` binary: `cargo build -p fleet-sim`.

#[path = "router/support.rs"]
mod support;

#[path = "router/admin.rs"]
mod admin;
#[path = "router/attacks.rs"]
mod attacks;
#[path = "router/engine_load.rs"]
mod engine_load;
#[path = "router/etcd.rs"]
mod etcd;
#[path = "router/features.rs"]
mod features;
#[path = "router/kv_events.rs"]
mod kv_events;
#[path = "router/limits.rs"]
mod limits;
#[path = "router/load.rs"]
mod load;
#[path = "router/openai_client.rs"]
mod openai_client;
#[path = "router/pd.rs"]
mod pd;
#[path = "router/resilience.rs"]
mod resilience;
#[path = "router/routing.rs"]
mod routing;
#[path = "router/shutdown.rs"]
mod shutdown;
#[cfg(feature = "tokenizer")]
#[path = "router/vllm.rs"]
mod vllm;
