//! Every engine's exposition (two scrapes 5 s apart, under `tests/fixtures/`) parsed, detected
//! and normalised, checked against a table of expected signals; vLLM 0.32's exposition recorded from a
//! real server, and the same with two data-parallel ranks; plus counter resets, missing families and
//! unknown endpoints.

use std::path::PathBuf;
use std::time::Duration;

use fleet_telemetry::exposition::parse;
use fleet_telemetry::{Engine, EngineSignals, ReplicaSignals, Window, read};

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Signals from scrape 1 at t=0 and scrape 2 at t=5 s of fixture `stem`.
fn signals_of(first: &str, second: &str) -> ReplicaSignals {
    let mut window = Window::new(Duration::from_secs(30));
    for (at, text) in [(0.0, first), (5.0, second)] {
        let exposition = parse(text).unwrap_or_else(|e| panic!("{e}"));
        window.push(at, &read(&exposition).unwrap_or_else(|e| panic!("{e}")));
    }
    window.signals().expect("two readings give signals")
}

struct Case {
    stem: &'static str,
    engine: Engine,
    flavor_contains: &'static str,
    model: Option<&'static str>,
    expect: EngineSignals,
    /// `(rank, running, hit_rate)` for engines that label ranks.
    ranks: &'static [(&'static str, Option<f64>, Option<f64>)],
}

const fn s() -> EngineSignals {
    EngineSignals {
        queue_depth: None,
        running: None,
        kv_usage: None,
        hit_rate: None,
        ttft_p50_s: None,
        ttft_p95_s: None,
        ttft_p99_s: None,
        itl_p50_s: None,
        itl_p95_s: None,
        itl_mean_s: None,
        prompt_tokens_per_s: None,
        generation_tokens_per_s: None,
        preemptions_per_s: None,
        kv_transfer_mean_s: None,
    }
}

fn cases() -> Vec<Case> {
    let vllm = EngineSignals {
        queue_depth: Some(2.0),
        running: Some(5.0),
        kv_usage: Some(0.4),
        hit_rate: Some(1750.0 / 3000.0),
        ttft_p50_s: Some(0.175),
        ttft_p95_s: Some(0.2425),
        ttft_p99_s: Some(0.2485),
        itl_p50_s: Some(0.0175),
        itl_p95_s: Some(0.02425),
        itl_mean_s: Some(0.02),
        prompt_tokens_per_s: Some(600.0),
        generation_tokens_per_s: Some(100.0),
        preemptions_per_s: Some(1.0),
        kv_transfer_mean_s: None,
    };
    let vllm_ranks: &[(&str, Option<f64>, Option<f64>)] =
        &[("0", Some(3.0), Some(0.75)), ("1", Some(2.0), Some(0.25))];
    vec![
        Case {
            stem: "vllm",
            engine: Engine::Vllm,
            flavor_contains: "current",
            model: Some("meta-llama/Llama-3.1-8B-Instruct"),
            expect: vllm,
            ranks: vllm_ranks,
        },
        Case {
            stem: "vllm-legacy",
            engine: Engine::Vllm,
            flavor_contains: "legacy",
            model: Some("meta-llama/Llama-3.1-8B-Instruct"),
            expect: vllm,
            ranks: vllm_ranks,
        },
        Case {
            stem: "llm-d-sim",
            engine: Engine::Vllm,
            flavor_contains: "llm-d-inference-sim",
            model: Some("Qwen/Qwen2.5-1.5B-Instruct"),
            expect: EngineSignals {
                queue_depth: Some(2.0),
                running: Some(4.0),
                kv_usage: Some(0.125),
                hit_rate: Some(0.5),
                ttft_p50_s: Some(0.375),
                ttft_p95_s: Some(0.4875),
                ttft_p99_s: Some(0.4975),
                itl_p50_s: Some(0.0375),
                itl_p95_s: Some(0.04875),
                itl_mean_s: Some(0.04),
                prompt_tokens_per_s: Some(120.0),
                generation_tokens_per_s: Some(50.0),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "sglang",
            engine: Engine::Sglang,
            flavor_contains: "SGLang",
            model: Some("Qwen/Qwen3-8B"),
            expect: EngineSignals {
                queue_depth: Some(3.0),
                running: Some(6.0),
                kv_usage: Some(0.62),
                hit_rate: Some(0.75),
                ttft_p50_s: Some(0.4 + 0.2 * 10.0 / 18.0),
                ttft_p95_s: Some(1.5),
                ttft_p99_s: Some(1.9),
                itl_p50_s: Some(0.0175),
                itl_p95_s: Some(0.01975),
                itl_mean_s: Some(0.018),
                prompt_tokens_per_s: Some(800.0),
                generation_tokens_per_s: Some(400.0),
                preemptions_per_s: Some(0.2),
                kv_transfer_mean_s: None,
            },
            ranks: &[],
        },
        Case {
            stem: "tgi",
            engine: Engine::Tgi,
            flavor_contains: "TGI",
            model: None,
            expect: EngineSignals {
                queue_depth: Some(5.0),
                running: Some(8.0),
                kv_usage: Some(0.25),
                itl_p50_s: Some(
                    0.0001 * 1.5f64.powi(13) + 0.0001 * (1.5f64.powi(14) - 1.5f64.powi(13)) * 0.5,
                ),
                itl_p95_s: Some(
                    0.0001 * 1.5f64.powi(13) + 0.0001 * (1.5f64.powi(14) - 1.5f64.powi(13)) * 0.95,
                ),
                itl_mean_s: Some(0.025),
                prompt_tokens_per_s: Some(800.0),
                generation_tokens_per_s: Some(500.0),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "llamacpp",
            engine: Engine::LlamaCpp,
            flavor_contains: "llama.cpp",
            model: None,
            expect: EngineSignals {
                queue_depth: Some(1.0),
                running: Some(2.0),
                kv_usage: Some(0.21),
                itl_mean_s: Some(0.025),
                prompt_tokens_per_s: Some(500.0),
                generation_tokens_per_s: Some(40.0),
                ..s()
            },
            ranks: &[],
        },
        // The real thing (captured from llama.cpp b11434): cached prompt tokens give a hit rate; no KV
        // usage, TTFT or preemption figure exists, so those stay None rather than 0.
        Case {
            stem: "llamacpp-b11434",
            engine: Engine::LlamaCpp,
            flavor_contains: "llama.cpp",
            model: None,
            expect: EngineSignals {
                queue_depth: Some(0.0),
                running: Some(0.0),
                hit_rate: Some(303.0 / 606.0),
                itl_mean_s: Some((7.91394 - 7.9044) / 8.0),
                prompt_tokens_per_s: Some(606.0 / 5.0),
                generation_tokens_per_s: Some(8.0 / 5.0),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "trtllm",
            engine: Engine::TrtLlm,
            flavor_contains: "trtllm-serve",
            model: Some("nvidia/Llama-3.1-8B-Instruct-FP8"),
            expect: EngineSignals {
                queue_depth: Some(0.0),
                running: Some(7.0),
                kv_usage: Some(0.455),
                hit_rate: Some(0.75),
                ttft_p50_s: Some(0.175),
                ttft_p95_s: Some(0.2425),
                ttft_p99_s: Some(0.2485),
                itl_p50_s: Some(0.0175),
                itl_p95_s: Some(0.02425),
                itl_mean_s: Some(0.02),
                prompt_tokens_per_s: Some(2000.0),
                generation_tokens_per_s: Some(480.0),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "triton",
            engine: Engine::Triton,
            flavor_contains: "TensorRT-LLM backend",
            model: Some("tensorrt_llm"),
            expect: EngineSignals {
                queue_depth: Some(4.0),
                running: Some(6.0),
                kv_usage: Some(0.4875),
                ttft_p50_s: Some(0.3),
                ttft_p95_s: Some(0.48),
                ttft_p99_s: Some(0.496),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "dynamo-frontend",
            engine: Engine::Dynamo,
            flavor_contains: "frontend",
            model: Some("qwen/qwen3-0.6b"),
            expect: EngineSignals {
                queue_depth: Some(2.0),
                running: Some(7.0),
                // 7,500 cached of 12,500 input tokens: the two histograms' `_sum` increases.
                hit_rate: Some(0.6),
                ttft_p50_s: Some(0.047 + 0.053 * 12.5 / 20.0),
                ttft_p95_s: Some(0.19),
                ttft_p99_s: Some(0.1 + 0.12 * (24.75 - 20.0) / 5.0),
                itl_p50_s: Some(0.00985),
                itl_p95_s: Some(0.0067 + 0.0063 * 0.95),
                itl_mean_s: Some(0.011),
                prompt_tokens_per_s: Some(2500.0),
                generation_tokens_per_s: Some(1040.0),
                ..s()
            },
            ranks: &[],
        },
        Case {
            stem: "dynamo-worker",
            engine: Engine::Dynamo,
            flavor_contains: "worker (vLLM",
            model: Some("Qwen/Qwen3-0.6B"),
            expect: EngineSignals {
                queue_depth: Some(0.0),
                running: Some(3.0),
                kv_usage: Some(0.149),
                hit_rate: Some(0.8),
                ttft_p50_s: Some(0.03),
                ttft_p95_s: Some(0.039),
                ttft_p99_s: Some(0.0398),
                prompt_tokens_per_s: Some(200.0),
                generation_tokens_per_s: Some(100.0),
                ..s()
            },
            ranks: &[("0", Some(3.0), Some(0.8))],
        },
    ]
}

fn close(field: &str, stem: &str, got: Option<f64>, want: Option<f64>) {
    match (got, want) {
        (Some(g), Some(w)) => {
            assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{stem}: {field} is {g}, want {w}")
        }
        (g, w) => assert_eq!(g, w, "{stem}: {field} (None means not provided)"),
    }
}

fn check(stem: &str, got: &EngineSignals, want: &EngineSignals) {
    for ((field, g), (_, w)) in got.fields().into_iter().zip(want.fields()) {
        close(field, stem, g, w);
    }
}

#[test]
fn every_engine_fixture_is_detected_and_normalised() {
    let cases = cases();
    assert_eq!(cases.len(), 11);
    for case in cases {
        let signals = signals_of(
            &fixture(&format!("{}.1.prom", case.stem)),
            &fixture(&format!("{}.2.prom", case.stem)),
        );
        assert_eq!(signals.engine, case.engine, "{}", case.stem);
        assert!(signals.flavor.contains(case.flavor_contains), "{}: flavor {:?}", case.stem, signals.flavor);
        assert_eq!(signals.model.as_deref(), case.model, "{}", case.stem);
        check(case.stem, &signals.total, &case.expect);
        assert_eq!(signals.ranks.len(), case.ranks.len(), "{}: ranks {:?}", case.stem, signals.ranks);
        for ((rank, got), (want_rank, running, hit)) in signals.ranks.iter().zip(case.ranks) {
            assert_eq!(rank, want_rank, "{}", case.stem);
            close("rank running", case.stem, got.running, *running);
            close("rank hit_rate", case.stem, got.hit_rate, *hit);
        }
    }
}

#[test]
fn the_engine_names_match_the_probe_contract() {
    let names: Vec<&str> = [
        Engine::Vllm,
        Engine::Sglang,
        Engine::Tgi,
        Engine::LlamaCpp,
        Engine::TrtLlm,
        Engine::Triton,
        Engine::Dynamo,
    ]
    .into_iter()
    .map(Engine::name)
    .collect();
    assert_eq!(names, ["vllm", "sglang", "tgi", "llamacpp", "trtllm", "triton", "dynamo"]);
}

#[test]
fn a_restart_between_scrapes_gives_the_new_counts_not_negative_rates() {
    // Scrape 2 first, then scrape 1: every counter went backwards, as after a restart.
    for stem in ["vllm", "sglang", "tgi", "llamacpp", "trtllm", "dynamo-frontend"] {
        let signals = signals_of(&fixture(&format!("{stem}.2.prom")), &fixture(&format!("{stem}.1.prom")));
        let t = signals.total;
        for (field, value) in [
            ("prompt_tokens_per_s", t.prompt_tokens_per_s),
            ("generation_tokens_per_s", t.generation_tokens_per_s),
            ("preemptions_per_s", t.preemptions_per_s),
            ("hit_rate", t.hit_rate),
            ("itl_mean_s", t.itl_mean_s),
        ] {
            assert!(value.is_none_or(|v| v >= 0.0 && v.is_finite()), "{stem}: {field} = {value:?}");
        }
        assert!(
            t.prompt_tokens_per_s.unwrap() > 0.0,
            "{stem}: the restarted counter's value is the increase"
        );
    }
    // vLLM after a restart: the window takes scrape 1's counters as the increase.
    let vllm = signals_of(&fixture("vllm.2.prom"), &fixture("vllm.1.prom")).total;
    close("hit_rate", "vllm reset", vllm.hit_rate, Some(7000.0 / 15000.0));
    close("prompt_tokens_per_s", "vllm reset", vllm.prompt_tokens_per_s, Some(29000.0 / 5.0));
}

#[test]
fn a_missing_family_is_not_provided_and_the_others_still_are() {
    let without = |text: &str, family: &str| -> String {
        text.lines().filter(|l| !l.contains(family)).map(|l| format!("{l}\n")).collect()
    };
    let (a, b) = (fixture("vllm.1.prom"), fixture("vllm.2.prom"));
    let family = "vllm:time_to_first_token_seconds";
    let signals = signals_of(&without(&a, family), &without(&b, family)).total;
    assert_eq!((signals.ttft_p50_s, signals.ttft_p95_s, signals.ttft_p99_s), (None, None, None));
    assert_eq!(signals.running, Some(5.0));
    close("hit_rate", "vllm without ttft", signals.hit_rate, Some(1750.0 / 3000.0));

    // Without prefix counters, hit rate is "not provided", not zero.
    let family = "vllm:prefix_cache_";
    let signals = signals_of(&without(&a, family), &without(&b, family)).total;
    assert_eq!(signals.hit_rate, None);
    assert_eq!(signals.kv_usage, Some(0.4));

    // SGLang without its counters falls back to its own hit-rate gauge.
    let (a, b) = (fixture("sglang.1.prom"), fixture("sglang.2.prom"));
    let family = "sglang:cached_tokens";
    let signals = signals_of(&without(&a, family), &without(&b, family)).total;
    close("hit_rate", "sglang gauge", signals.hit_rate, Some(0.41));

    // A single scrape gives gauges but no rates.
    let exposition = parse(&fixture("tgi.1.prom")).unwrap();
    let mut window = Window::new(Duration::from_secs(30));
    window.push(0.0, &read(&exposition).unwrap());
    let once = window.signals().unwrap().total;
    assert_eq!((once.queue_depth, once.prompt_tokens_per_s, once.itl_mean_s), (Some(5.0), None, None));
}

#[test]
fn an_unknown_endpoint_is_unsupported_and_lists_its_families() {
    let text = "# HELP http_requests_total Requests.\n# TYPE http_requests_total counter\n\
                http_requests_total{code=\"200\"} 10\nhttp_requests_created{code=\"200\"} 1.7e9\n\
                # TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n# EOF\n";
    let error = read(&parse(text).unwrap()).unwrap_err();
    assert_eq!(error.families, ["http_requests_created", "http_requests_total", "process_cpu_seconds_total"]);
    let message = error.to_string();
    assert!(message.starts_with("unsupported engine"), "{message}");
    assert!(message.contains("process_cpu_seconds_total"), "{message}");
}

/// Every fixture file: its path and text.
fn every_fixture() -> Vec<(PathBuf, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

#[test]
fn every_fixture_cites_the_source_of_its_names() {
    let fixtures = every_fixture();
    for (path, text) in &fixtures {
        assert!(text.starts_with("# Source of names"), "{} does not cite its source", path.display());
    }
    assert_eq!(fixtures.len(), 30);
}

/// The readings of a fixture's two scrapes.
fn readings(stem: &str) -> [fleet_telemetry::Reading; 2] {
    [1, 2].map(|n| {
        let text = fixture(&format!("{stem}.{n}.prom"));
        read(&parse(&text).unwrap_or_else(|e| panic!("{stem}.{n}: {e}"))).unwrap_or_else(|e| panic!("{e}"))
    })
}

#[test]
fn vllm_0_32_as_recorded_gives_every_signal() {
    let [_, second] = readings("vllm-0.32");
    assert_eq!(second.engine, Engine::Vllm);
    assert!(second.flavor.contains("current"), "{}", second.flavor);
    assert_eq!(second.model.as_deref(), Some("tiny-llama3"));
    let raw = &second.total;
    // An idle server: zero, not "not provided".
    assert_eq!((raw.waiting, raw.running, raw.kv_usage), (Some(0.0), Some(0.0), Some(0.0)));
    assert_eq!((raw.prefix_queries, raw.prefix_hits), (Some(3616.0), Some(2976.0)));
    assert_eq!((raw.prompt_tokens, raw.prompt_tokens_cached), (Some(3616.0), Some(2976.0)));
    assert_eq!((raw.generation_tokens, raw.preemptions), (Some(120.0), Some(0.0)));
    let ttft = raw.ttft.as_ref().expect("TTFT histogram");
    assert_eq!((ttft.count, ttft.buckets.len()), (18.0, 23));
    assert!((ttft.sum - 6.7524094581604).abs() < 1e-12);
    assert_eq!(ttft.buckets.last(), Some(&(f64::INFINITY, 18.0)));
    assert_eq!(second.ranks.len(), 1);
    assert_eq!(second.ranks[0].0, "0");
    assert_eq!(&second.ranks[0].1, raw, "one engine: the rank is the replica");

    let signals = signals_of(&fixture("vllm-0.32.1.prom"), &fixture("vllm-0.32.2.prom")).total;
    close("hit_rate", "vllm-0.32", signals.hit_rate, Some((2976.0 - 800.0) / (3616.0 - 1106.0)));
    close("prompt_tokens_per_s", "vllm-0.32", signals.prompt_tokens_per_s, Some((3616.0 - 1106.0) / 5.0));
    close("generation_tokens_per_s", "vllm-0.32", signals.generation_tokens_per_s, Some(96.0 / 5.0));
    close("preemptions_per_s", "vllm-0.32", signals.preemptions_per_s, Some(0.0));
    // 12 first tokens between the scrapes: 5 by 40 ms, 7 by 60 ms, ..., 11 by 1 s, 12 by 2.5 s.
    close("ttft_p50_s", "vllm-0.32", signals.ttft_p50_s, Some(0.04 + 0.02 * (6.0 - 5.0) / 2.0));
    close("ttft_p95_s", "vllm-0.32", signals.ttft_p95_s, Some(1.0 + 1.5 * (11.4 - 11.0)));
    assert!(signals.itl_p50_s.is_some() && signals.itl_mean_s.is_some());
}

#[test]
fn vllm_0_32_data_parallel_ranks_add_up_and_kv_usage_averages() {
    let [_, one] = readings("vllm-0.32");
    let [_, two] = readings("vllm-0.32-dp2");
    let (one_raw, two_raw) = (&one.total, &two.total);
    let doubled = |v: Option<f64>| v.map(|v| 2.0 * v);
    assert_eq!(two_raw.prefix_queries, doubled(one_raw.prefix_queries));
    assert_eq!(two_raw.prefix_hits, doubled(one_raw.prefix_hits));
    assert_eq!(two_raw.prompt_tokens_cached, doubled(one_raw.prompt_tokens_cached));
    assert_eq!(two_raw.generation_tokens, doubled(one_raw.generation_tokens));
    assert_eq!((two_raw.running, two_raw.waiting), (Some(0.0), Some(0.0)));
    assert_eq!(two_raw.kv_usage, one_raw.kv_usage, "a fraction: averaged over ranks, not added");
    let (ttft_one, ttft_two) = (one_raw.ttft.as_ref().unwrap(), two_raw.ttft.as_ref().unwrap());
    assert_eq!(ttft_two.count, 2.0 * ttft_one.count);
    assert_eq!(two.ranks.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(), ["0", "1"]);
    for (_, rank) in &two.ranks {
        assert_eq!(rank, one_raw, "each rank reads as the one engine it copies");
    }

    let one = signals_of(&fixture("vllm-0.32.1.prom"), &fixture("vllm-0.32.2.prom"));
    let two = signals_of(&fixture("vllm-0.32-dp2.1.prom"), &fixture("vllm-0.32-dp2.2.prom"));
    close("hit_rate", "dp2", two.total.hit_rate, one.total.hit_rate);
    close(
        "prompt_tokens_per_s",
        "dp2",
        two.total.prompt_tokens_per_s,
        doubled(one.total.prompt_tokens_per_s),
    );
    close("ttft_p50_s", "dp2", two.total.ttft_p50_s, one.total.ttft_p50_s);
    close("ttft_p95_s", "dp2", two.total.ttft_p95_s, one.total.ttft_p95_s);
    assert_eq!(two.ranks.len(), 2);
    for (_, rank) in &two.ranks {
        close("rank hit_rate", "dp2", rank.hit_rate, one.total.hit_rate);
        close("rank prompt_tokens_per_s", "dp2", rank.prompt_tokens_per_s, one.total.prompt_tokens_per_s);
    }
}

#[test]
fn the_load_reader_reads_every_engines_load_as_the_whole_reading_has_it_from_a_few_families() {
    use fleet_telemetry::engines::LoadReader;
    let mut checked = 0;
    for (path, text) in every_fixture() {
        let whole = parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let Ok(reading) = read(&whole) else { continue };
        let reader = LoadReader::detect(&whole).expect("the engine read() detected");
        let load = reader.read_text(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let total = reading.total;
        assert_eq!(
            (load.waiting, load.running, load.kv_usage),
            (total.waiting, total.running, total.kv_usage),
            "{}",
            path.display()
        );
        checked += 1;
    }
    assert!(checked >= 28, "{checked} fixtures read");
    // Data-parallel ranks: the KV usage is their mean, as in the whole reading.
    let text = fixture("vllm-0.32-dp2.1.prom");
    let reader = LoadReader::detect(&parse(&text).unwrap()).unwrap();
    let load = reader.read_text(&text).unwrap();
    assert!(load.kv_usage.is_some() && load.running.is_some(), "{load:?}");
    // Another engine behind the URL gives no figures (the router then detects again), not wrong ones.
    let other = reader.read_text(&fixture("sglang.1.prom")).unwrap();
    assert_eq!((other.waiting, other.running), (None, None));
}
