//! Disaggregated prefill/decode figures read from fixtures of fleet-sim's vLLM (NixlConnector) and SGLang
//! expositions: what the app needs per role (queues) and per transfer (time, bytes, failures).

use std::path::PathBuf;

use fleet_telemetry::exposition::parse;
use fleet_telemetry::pd::{PdReading, mean_transfer_s, read_pd};
use fleet_telemetry::{Engine, read};

fn reading(name: &str) -> (Engine, Option<PdReading>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let exposition = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let engine = read(&exposition).unwrap_or_else(|e| panic!("{name}: {e}")).engine;
    (engine, read_pd(&exposition))
}

#[test]
fn vllm_nixl_transfers_give_their_mean_time_bytes_and_failures() {
    let (engine, first) = reading("vllm-nixl-decode.1.prom");
    assert_eq!(engine, Engine::Vllm, "a connector's metrics do not hide the engine");
    let first = first.expect("NIXL metrics are P/D figures");
    assert_eq!(first.transfers, Some(2.0));
    assert_eq!(first.transfer_bytes, Some(5.0 * 1024.0 * 131_072.0), "1024 + 4096 tokens of 128 KiB");
    assert_eq!(first.failed_transfers, Some(0.0));
    assert_eq!(first.abandoned, Some(0.0));
    assert_eq!(
        (first.prefill_queue, first.decode_queue, first.last_transfer_s),
        (None, None, None),
        "not vLLM's"
    );
    let (_, second) = reading("vllm-nixl-decode.2.prom");
    let second = second.expect("P/D figures");
    assert_eq!((second.transfers, second.failed_transfers), (Some(4.0), Some(1.0)));
    // Between the scrapes: 8192 and 256 tokens at 100 Gbit/s plus 0.5 ms each.
    let mean = mean_transfer_s(&first, &second).expect("two transfers between the scrapes");
    let expected = ((8192.0 + 256.0) * 131_072.0 * 8.0 / 100e9 + 2.0 * 0.5e-3) / 2.0;
    assert!((mean - expected).abs() < 2e-6, "mean {mean} vs {expected}");
    assert_eq!(mean_transfer_s(&second, &first), None, "a counter going backwards is a restart");
    assert_eq!(mean_transfer_s(&second, &second), None, "no transfer, no mean");
}

#[test]
fn sglang_gives_each_roles_queue_and_the_latest_transfer() {
    let (engine, prefill) = reading("sglang-pd-prefill.prom");
    assert_eq!(engine, Engine::Sglang);
    let prefill = prefill.expect("P/D figures");
    assert_eq!(prefill.prefill_queue, Some(3.0), "tensor-parallel rank 1 repeats rank 0 and is not added");
    assert_eq!(prefill.decode_queue, Some(0.0));
    let latency = prefill.last_transfer_s.expect("the prefill side times the transfer");
    assert!((latency - (2048.0 * 131_072.0 * 8.0 / 100e9 + 0.5e-3)).abs() < 2e-6, "{latency}");
    assert!(prefill.last_transfer_gb_s.is_some_and(|gb| gb > 10.0 && gb < 12.5), "{prefill:?}");
    assert_eq!(prefill.transfers, None, "SGLang has no per-transfer histogram");

    let (_, decode) = reading("sglang-pd-decode.prom");
    let decode = decode.expect("P/D figures");
    assert_eq!(
        (decode.prefill_queue, decode.decode_queue),
        (Some(0.0), Some(3.0)),
        "2 waiting + 1 receiving"
    );
    assert_eq!(decode.failed_transfers, Some(0.0));
}

#[test]
fn an_exposition_without_disaggregation_has_no_pd_figures() {
    let text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\n";
    assert_eq!(read_pd(&parse(text).expect("parses")), None);
}
