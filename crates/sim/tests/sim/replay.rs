//! What-if replay: exact hits on a hand-computed trace, the pooled bound against brute force, determinism,
//! progress and cancellation, and the `replay` / `gen` / `compare` commands as real processes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use fleet_policy::PolicySpec;
use fleet_sim::replay::pooled::pooled_cached_tokens;
use fleet_sim::replay::{self, PreparedRequest, PreparedTrace, ReplayConfig, ReplayControl, ReplayError};
use fleet_sim::workload::{GenConfig, generate};
use fleet_trace::{Trace, TraceRecord};
use proptest::prelude::*;

fn tiny_trace() -> Trace {
    // 512-token blocks (Mooncake). Arrivals 10 s apart, so every request has finished before the next.
    Trace::from_records(vec![
        TraceRecord::mooncake(0, 1025, 2, vec![1, 2, 3]), // 2 full blocks, nothing cached
        TraceRecord::mooncake(10_000, 1025, 2, vec![1, 2, 4]), // shares blocks 1, 2
        TraceRecord::mooncake(20_000, 1024, 2, vec![1, 2]), // a full hit is capped at 1023 tokens: 1 block
        TraceRecord::mooncake(30_000, 1024, 2, vec![5, 2]), // same id 2, other prefix: no hit
    ])
    .expect("valid")
}

#[test]
fn a_hand_computed_tiny_trace_gives_the_exact_hits() {
    let prepared = replay::prepare(&tiny_trace(), None, 1.0).expect("prepared");
    let prompt_tokens = 1025 + 1025 + 1024 + 1024;
    // One replica: requests 2 and 3 hit 1024 and 512 tokens.
    let one = replay::replay(
        &prepared,
        &ReplayConfig::new(1, PolicySpec::named("round_robin")),
        ReplayControl::default(),
    )
    .expect("replayed");
    assert_eq!(one.requests, 4);
    assert_eq!(one.hit_rate, f64::from(1024 + 512) / f64::from(prompt_tokens));
    assert_eq!(one.per_replica[0].cached_tokens, 1536);
    assert_eq!(one.per_replica[0].prefill_tokens, prompt_tokens as u64 - 1536);
    // Two replicas in turn (from a drawn start): requests 0, 2 on one and 1, 3 on the other, so only
    // request 2 hits (512 tokens).
    let two = replay::replay(
        &prepared,
        &ReplayConfig::new(2, PolicySpec::named("round_robin")),
        ReplayControl::default(),
    )
    .expect("replayed");
    assert_eq!(two.hit_rate, 512.0 / f64::from(prompt_tokens));
    let mut per_replica: Vec<_> = two.per_replica.iter().map(|r| (r.requests, r.cached_tokens)).collect();
    per_replica.sort_unstable();
    assert_eq!(per_replica, vec![(2, 0), (2, 512)]);
    // kv_precise follows the KV events: request 1 goes where blocks 1, 2 are, as does request 2.
    let precise = replay::replay(
        &prepared,
        &ReplayConfig::new(2, PolicySpec::named("kv_precise")),
        ReplayControl::default(),
    )
    .expect("replayed");
    assert_eq!(precise.hit_rate, one.hit_rate);
    // The pooled bound of a big cache equals the single replica here.
    assert_eq!(one.pooled_bound_hit_rate, one.hit_rate);
    assert!(one.ttft_p50_s > 0.0 && one.ttft_p50_s <= one.ttft_p99_s);
}

#[test]
fn the_unqueued_p95_is_what_requests_alone_on_one_warm_replica_take_and_queueing_only_adds() {
    // Requests 10 s apart on one replica run alone with its whole cache, as the reference assumes: the
    // replay's p95 is the reference's, to the microsecond.
    let prepared = replay::prepare(&tiny_trace(), None, 1.0).expect("prepared");
    let alone = replay::replay(
        &prepared,
        &ReplayConfig::new(1, PolicySpec::named("round_robin")),
        ReplayControl::default(),
    )
    .expect("replayed");
    assert!(alone.unqueued_ttft_p95_s > 0.0);
    assert!((alone.ttft_p95_s - alone.unqueued_ttft_p95_s).abs() < 1e-6, "{alone:?}");
    // The same requests arriving at once queue behind each other: p95 above the reference.
    let at_once: Vec<TraceRecord> =
        tiny_trace().records.into_iter().map(|r| TraceRecord { timestamp: 0, ..r }).collect();
    let prepared =
        replay::prepare(&Trace::from_records(at_once).expect("valid"), None, 1.0).expect("prepared");
    let queued = replay::replay(
        &prepared,
        &ReplayConfig::new(1, PolicySpec::named("round_robin")),
        ReplayControl::default(),
    )
    .expect("replayed");
    assert!(queued.ttft_p95_s > queued.unqueued_ttft_p95_s + 1e-3, "{queued:?}");
}

/// The pooled bound by brute force: an ordered list, least recently used first.
fn brute_force_pooled(trace: &PreparedTrace, capacity: usize) -> Vec<u64> {
    let mut lru: Vec<u64> = Vec::new();
    let block = u64::from(trace.block_tokens);
    trace
        .requests
        .iter()
        .map(|request| {
            let cap = ((u64::from(request.prompt_tokens) - 1) / block) as usize;
            let matched =
                request.block_hashes.iter().take(cap).take_while(|h| lru.contains(h)).count() as u64;
            for hash in request.block_hashes.iter().rev() {
                lru.retain(|h| h != hash);
                lru.push(*hash);
                if lru.len() > capacity {
                    lru.remove(0);
                }
            }
            matched * block
        })
        .collect()
}

fn prepared_of(prompts: &[Vec<u64>]) -> PreparedTrace {
    let requests = prompts
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            // Chain the ids as prepare does, so equal ids at the same position mean equal prefixes.
            let hashes = fleet_policy::chain_block_ids(ids);
            PreparedRequest {
                arrival_us: i as u64 * 1000,
                prompt_tokens: ids.len() as u32 * 16 + 3,
                output_tokens: 4,
                block_hashes: Arc::from(hashes),
                session: None,
                router: None,
            }
        })
        .collect();
    PreparedTrace { requests, block_tokens: 16, trace_block_tokens: 16, routers: Vec::new() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_pooled_bound_matches_a_brute_force_lru(
        prompts in prop::collection::vec(prop::collection::vec(0u64..4, 1..8), 1..40),
        capacity in 1usize..24,
    ) {
        let trace = prepared_of(&prompts);
        prop_assert_eq!(pooled_cached_tokens(&trace, capacity as u64), brute_force_pooled(&trace, capacity));
    }
}

fn generated(requests: usize) -> Trace {
    Trace::from_records(generate(&GenConfig { requests, ..GenConfig::default() }).expect("valid"))
        .expect("valid")
}

#[test]
fn the_same_seed_gives_the_same_report_and_policies_differ() {
    let prepared = replay::prepare(&generated(1500), None, 2.0).expect("prepared");
    for policy in ["random", "power_of_two", "kv_precise"] {
        let config = ReplayConfig { seed: 11, ..ReplayConfig::new(4, PolicySpec::named(policy)) };
        let a = replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed");
        let b = replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed");
        assert_eq!(
            serde_json::to_string(&a).expect("json"),
            serde_json::to_string(&b).expect("json"),
            "{policy}"
        );
    }
    let reports = replay::compare(
        &prepared,
        &ReplayConfig::new(4, PolicySpec::default()),
        &[PolicySpec::named("round_robin"), PolicySpec::named("cache_aware_approx")],
        2,
        None,
    );
    let hits: Vec<f64> = reports.into_iter().map(|r| r.expect("replayed").hit_rate).collect();
    assert!(hits[1] > hits[0], "prefix affinity beats round robin on a prefix-heavy workload: {hits:?}");
}

#[test]
fn replica_metrics_reach_the_policy_only_when_a_router_would_scrape_them() {
    // By default the replay feeds the policy no metrics (a fleet-router run with --engine-metrics-ms 0), and
    // a metric-weighted policy decides on its own outstanding requests, as that router does. Fed before
    // every pick, the same policy places the same traffic otherwise.
    let prepared = replay::prepare(&generated(1500), None, 2.0).expect("prepared");
    let placement = |config: &ReplayConfig| {
        let report = replay::replay(&prepared, config, ReplayControl::default()).expect("replayed");
        report.per_replica.iter().map(|r| r.requests).collect::<Vec<_>>()
    };
    let blind = ReplayConfig {
        capacity_blocks: Some(3000),
        ..ReplayConfig::new(4, PolicySpec::named("weighted_scorers"))
    };
    assert_eq!(blind.metrics_interval_ms, None, "the default reads no metrics");
    let fed = ReplayConfig { metrics_interval_ms: Some(0), ..blind.clone() };
    assert_ne!(placement(&blind), placement(&fed), "queue and KV usage change a weighted_scorers placement");
    // Round robin reads no metrics: fed or not, it places alike.
    let rr = ReplayConfig { policy: PolicySpec::named("round_robin"), ..blind };
    assert_eq!(placement(&rr), placement(&ReplayConfig { metrics_interval_ms: Some(0), ..rr.clone() }));
}

#[test]
fn a_request_goes_through_the_router_that_recorded_it() {
    // The app's what-if names each request's router; the replay sends it through that one instead of
    // spreading sessions over the routers.
    let trace = generated(600);
    let recorded_by = |router: &dyn Fn(usize) -> String| {
        let records = trace
            .records
            .iter()
            .enumerate()
            .map(|(i, r)| TraceRecord { router: Some(router(i)), ..r.clone() })
            .collect();
        Trace::from_records(records).expect("valid")
    };
    let report = |trace: &Trace, routers: u32| {
        let prepared = replay::prepare(trace, None, 2.0).expect("prepared");
        let config = ReplayConfig {
            routers,
            metrics_interval_ms: Some(250),
            ..ReplayConfig::new(4, PolicySpec::named("cache_aware_approx"))
        };
        let report = replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed");
        serde_json::to_string(&report).expect("json")
    };
    let one_router = report(&trace, 1);
    // All of it recorded by one router: the other three route nothing, so it replays as one router.
    assert_eq!(report(&recorded_by(&|_| "http://only".to_owned()), 4), one_router);
    // Left to the sessions, or spread by the recording, four routers place it otherwise.
    assert_ne!(report(&trace, 4), one_router);
    assert_ne!(report(&recorded_by(&|i| format!("http://r{}", i % 4)), 4), one_router);
}

#[test]
fn routers_that_publish_their_load_weigh_each_others_requests_as_one_router_would() {
    // The bench routers' gen workload at 12 req/s over 8 replicas of 10,000 blocks, through 4 routers that
    // read the replicas' metrics every 250 ms. Without summaries a router weighs each request another
    // router sent as the average of its own, and power_of_two's TTFT p95 rises well above one router's.
    // With each router's in-flight blocks per replica handed to the others every 25 ms (fleet-router's
    // default through etcd), it comes back near one router's. Deterministic: one seed, virtual time.
    let config = GenConfig { requests: 1000, rate_rps: 12.0, seed: 7, ..GenConfig::default() };
    let trace = Trace::from_records(generate(&config).expect("valid")).expect("valid");
    let prepared = replay::prepare(&trace, None, 1.0).expect("prepared");
    let p95 = |routers: u32, peer_load_interval_ms: Option<u64>| {
        let config = ReplayConfig {
            routers,
            peer_load_interval_ms,
            capacity_blocks: Some(10_000),
            metrics_interval_ms: Some(250),
            ..ReplayConfig::new(8, PolicySpec::named("power_of_two"))
        };
        replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed").ttft_p95_s
    };
    let one = p95(1, None);
    let (apart, sharing) = (p95(4, None), p95(4, Some(25)));
    assert!(apart > one * 1.15, "4 routers without summaries {apart:.3} s, one router {one:.3} s");
    assert!(
        sharing < apart && sharing <= one * 1.1,
        "4 routers sharing {sharing:.3} s, apart {apart:.3} s, one {one:.3} s"
    );
    // One router has no one to share with: the setting changes nothing.
    assert_eq!(p95(1, Some(25)), one);
}

#[test]
fn several_routers_share_only_what_the_replicas_publish_unless_they_share_their_prompts() {
    // Each of 4 routers has its own engine. cache_aware_approx's tree learns only from its own router's
    // picks, so each router places a prefix that sessions share on its own and hits fall; kv_precise's
    // index is fed by the replicas' KV events, which reach every router, so it keeps most of them.
    let prepared = replay::prepare(&generated(1500), None, 2.0).expect("prepared");
    let hit_rate_sharing = |policy: &str, routers: u32, peer_load_interval_ms: Option<u64>| {
        let config = ReplayConfig {
            routers,
            peer_load_interval_ms,
            capacity_blocks: Some(3000),
            metrics_interval_ms: Some(250),
            ..ReplayConfig::new(4, PolicySpec::named(policy))
        };
        replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed").hit_rate
    };
    let hit_rate = |policy: &str, routers: u32| hit_rate_sharing(policy, routers, None);
    let (approx_1, approx_4) = (hit_rate("cache_aware_approx", 1), hit_rate("cache_aware_approx", 4));
    let (precise_1, precise_4) = (hit_rate("kv_precise", 1), hit_rate("kv_precise", 4));
    let (approx_lost, precise_lost) = (approx_1 - approx_4, precise_1 - precise_4);
    assert!(approx_lost > 0.03, "approx trees apart lose hits: {approx_1:.3} -> {approx_4:.3}");
    // kv_precise loses a little: each router counts only its own requests still in prefill as a prefix's
    // coming owners, so a new prefix that several routers send at once can be prefilled on several replicas.
    assert!(
        precise_lost < approx_lost / 2.0,
        "a shared KV index keeps most of them: {precise_1:.3} -> {precise_4:.3} (approx {approx_1:.3} -> \
         {approx_4:.3})"
    );
    // Routers that hand each other the prompts they route (prefix marks, with their load every 25 ms, as
    // fleet-routers sharing through etcd do) place a prefix where any of them sent it: the approximate
    // trees keep their hits.
    let approx_sharing = hit_rate_sharing("cache_aware_approx", 4, Some(25));
    assert!(
        approx_1 - approx_sharing < approx_lost / 3.0,
        "sharing prompts: {approx_1:.3} -> {approx_sharing:.3} (apart {approx_4:.3})"
    );
    // No router, or several in front of a prefill pool, is refused by name.
    let none = ReplayConfig { routers: 0, ..ReplayConfig::new(4, PolicySpec::named("random")) };
    let err = replay::replay(&prepared, &none, ReplayControl::default()).expect_err("no router");
    assert!(err.to_string().contains("routers"), "{err}");
    let pd = ReplayConfig { routers: 2, ..pd_config(pd_spec(0, 0, 1000), 1) };
    let err = replay::replay(&pd_trace(), &pd, ReplayControl::default()).expect_err("P/D with routers");
    assert!(err.to_string().contains("--routers 1"), "{err}");
}

#[test]
fn progress_is_reported_and_cancellation_stops_the_replay() {
    let prepared = replay::prepare(&generated(800), None, 1.0).expect("prepared");
    let config = ReplayConfig::new(4, PolicySpec::named("least_load"));
    let calls = AtomicUsize::new(0);
    let last = std::sync::Mutex::new(None);
    let progress = |p: replay::Progress| {
        calls.fetch_add(1, Ordering::Relaxed);
        *last.lock().expect("lock") = Some(p);
    };
    replay::replay(&prepared, &config, ReplayControl { progress: Some(&progress), cancel: None })
        .expect("replayed");
    assert!(calls.load(Ordering::Relaxed) >= 100);
    let done = last.lock().expect("lock").expect("reported");
    assert_eq!((done.routed, done.total), (800, 800));
    let cancel = AtomicBool::new(false);
    let cancel_at_half = |p: replay::Progress| {
        if p.routed >= 400 {
            cancel.store(true, Ordering::Relaxed);
        }
    };
    let result = replay::replay(
        &prepared,
        &config,
        ReplayControl { progress: Some(&cancel_at_half), cancel: Some(&cancel) },
    );
    assert!(matches!(result, Err(ReplayError::Cancelled)), "{result:?}");
}

#[test]
fn impossible_settings_are_named() {
    let prepared = replay::prepare(&tiny_trace(), None, 1.0).expect("prepared");
    let config =
        ReplayConfig { capacity_blocks: Some(2), ..ReplayConfig::new(1, PolicySpec::named("round_robin")) };
    let err = replay::replay(&prepared, &config, ReplayControl::default()).expect_err("too small");
    assert!(err.to_string().contains("--capacity-blocks"), "{err}");
    let err = replay::prepare(&tiny_trace(), Some(100), 1.0).expect_err("block size");
    assert!(err.to_string().contains("block_tokens"), "{err}");
}

fn fleet_sim(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fleet-sim")).args(args).output().expect("fleet-sim runs")
}

#[test]
fn the_commands_generate_replay_and_compare_a_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("gen.jsonl");
    let trace_arg = trace.to_str().expect("utf-8");
    let out = fleet_sim(&["gen", "--out", trace_arg, "--requests", "600", "--seed", "3", "--bursty", "4"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).expect("written");
    assert_eq!(text.lines().count(), 600);
    fleet_trace::read_trace(text.as_bytes()).expect("a valid Mooncake trace");

    let requests_out = dir.path().join("requests.jsonl");
    let out = fleet_sim(&[
        "replay",
        "--trace",
        trace_arg,
        "--replicas",
        "4",
        "--policy",
        "kv_precise",
        "--json",
        "--requests-out",
        requests_out.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    // One line per request, in arrival order, each on one of the 4 replicas.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&requests_out)
        .expect("written")
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 600);
    for (index, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], index);
        assert!(line["replica"].as_u64().expect("replica") < 4);
        assert!(line["cached_tokens"].as_u64() <= line["prompt_tokens"].as_u64());
        let ttft = line["ttft_s"].as_f64().expect("every request started");
        assert!(ttft > 0.0);
        // The engine's side as vLLM counts it: queued, then prefilling, adds up to the TTFT here (no
        // extra latency in the profile); the decode follows.
        let engine =
            line["queue_s"].as_f64().expect("queued") + line["prefill_s"].as_f64().expect("prefilled");
        assert!((engine - ttft).abs() < 1e-6, "request {index}: {engine} against {ttft}");
        assert!(line["decode_s"].as_f64().expect("finished") >= 0.0);
    }
    let keys: BTreeSet<&str> = report.as_object().expect("object").keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = [
        "requests",
        "hit_rate",
        "ttft_p50_s",
        "ttft_p95_s",
        "ttft_p99_s",
        "tpot_mean_s",
        "throughput_tok_s",
        "imbalance",
        "pooled_bound_hit_rate",
        "unqueued_ttft_p95_s",
        "per_replica",
    ]
    .into_iter()
    .collect();
    assert_eq!(keys, expected);
    assert_eq!(report["requests"], 600);
    assert_eq!(report["per_replica"].as_array().expect("array").len(), 4);

    let policy_file = dir.path().join("policy.yaml");
    std::fs::write(&policy_file, "policy: consistent_hash\nparams: {load_factor: 1.5}\n").expect("written");
    let out = fleet_sim(&[
        "replay",
        "--trace",
        trace_arg,
        "--replicas",
        "2",
        "--policy-file",
        policy_file.to_str().expect("utf-8"),
        "--capacity-blocks",
        "400",
        "--replica-metrics-ms",
        "500",
        "--block-tokens",
        "256",
        "--speedup",
        "2",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("pooled bound"));

    let out = fleet_sim(&[
        "compare",
        "--trace",
        trace_arg,
        "--replicas",
        "4",
        "--policies",
        "round_robin,kv_precise",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(reports["round_robin"]["hit_rate"].is_number() && reports["kv_precise"]["hit_rate"].is_number());

    let out = fleet_sim(&["replay", "--trace", trace_arg, "--policy", "no_such_policy"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_policy"));
}

#[test]
fn replay_adds_the_recordings_time_outside_the_engine_when_asked_and_says_when_it_cannot() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A recording as fleet-router writes one: 300 requests under round_robin, each with the first-token
    // time its client saw, well above what any replay of this traffic takes.
    let generated = generated(300);
    let recording = dir.path().join("recorded.jsonl");
    let mut text = Vec::new();
    for record in &generated.records {
        let recorded = TraceRecord {
            policy: Some("round_robin".to_owned()),
            ttft_ms: Some(2_000.0 + record.timestamp as f64 % 7.0),
            status: Some(200),
            ..record.clone()
        };
        fleet_trace::write_record(&mut text, &recorded).expect("written");
    }
    std::fs::write(&recording, text).expect("written");
    let recording_arg = recording.to_str().expect("utf-8");
    let replay_json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["replay", "--trace", recording_arg, "--replicas", "4", "--json"];
        args.extend_from_slice(extra);
        let out = fleet_sim(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let f = |v: &serde_json::Value| v.as_f64().expect("a number");

    let plain = replay_json(&["--policy", "kv_precise"]);
    assert!(plain.get("ttft_overhead_s").is_none(), "no overhead unless asked: {plain}");
    let added = replay_json(&["--policy", "kv_precise", "--add-recorded-overhead", "round_robin"]);
    // The overhead is the median of each request's recorded TTFT less its TTFT replayed under round_robin,
    // the same whichever policy is predicted, and every TTFT of the prediction moves by it while its
    // placement stays.
    let replayed_requests = dir.path().join("round_robin.requests.jsonl");
    replay_json(&["--policy", "round_robin", "--requests-out", replayed_requests.to_str().expect("utf-8")]);
    let mut residuals: Vec<f64> = std::fs::read_to_string(&replayed_requests)
        .expect("written")
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("JSON line"))
        .map(|line| {
            let record = &generated.records[line["index"].as_u64().expect("index") as usize];
            (2_000.0 + record.timestamp as f64 % 7.0) / 1e3 - f(&line["ttft_s"])
        })
        .collect();
    assert_eq!(residuals.len(), 300);
    residuals.sort_by(f64::total_cmp);
    let expected = residuals[149];
    let overhead = f(&added["ttft_overhead_s"]);
    assert!(expected > 0.0 && (overhead - expected).abs() < 1e-9, "{overhead} against {expected}");
    for key in ["ttft_p50_s", "ttft_p95_s", "ttft_p99_s"] {
        assert!((f(&added[key]) - f(&plain[key]) - overhead).abs() < 1e-9, "{key}: {added} against {plain}");
    }
    assert_eq!(added["hit_rate"], plain["hit_rate"]);
    let own = replay_json(&["--policy", "round_robin", "--add-recorded-overhead", "round_robin"]);
    assert!((f(&own["ttft_overhead_s"]) - overhead).abs() < 1e-9, "{own}");

    // A policy the trace was not recorded under cannot say; an unknown one is named.
    for (recorded_under, named) in
        [("least_load", "recorded under least_load"), ("no_such_policy", "no_such_policy")]
    {
        let args = ["replay", "--trace", recording_arg, "--policy", "kv_precise", "--add-recorded-overhead"];
        let out = fleet_sim(&[&args[..], &[recorded_under]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(named), "{stderr}");
    }
}

#[test]
fn a_profiles_extra_latency_adds_one_draw_to_each_request_and_moves_no_placement() {
    let prepared = replay::prepare(&generated(300), None, 1.0).expect("prepared");
    let config = ReplayConfig::new(4, PolicySpec::named("cache_aware_approx"));
    let run =
        |config: &ReplayConfig| replay::replay(&prepared, config, ReplayControl::default()).expect("ran");
    let base = run(&config);

    // A constant draw: every TTFT grows by exactly it, and nothing the engines or the policy did changes.
    let mut constant = config.clone();
    constant.profile.extra_latency_us = vec![40_000];
    let shifted = run(&constant);
    assert_eq!(shifted.hit_rate, base.hit_rate);
    assert_eq!(
        shifted.per_replica.iter().map(|r| r.requests).collect::<Vec<_>>(),
        base.per_replica.iter().map(|r| r.requests).collect::<Vec<_>>()
    );
    assert_eq!(shifted.per_request.len(), 300);
    for (with, without) in shifted.per_request.iter().zip(&base.per_request) {
        assert_eq!(with.replica, without.replica);
        let added = with.ttft_s.expect("started") - without.ttft_s.expect("started");
        assert!((added - 0.040).abs() < 1e-9, "request {}: {added} s added", with.index);
        // The engine's side (vLLM's queue, prefill and decode times) is the same: the draw is outside it.
        assert_eq!(
            (with.queue_s, with.prefill_s, with.decode_s),
            (without.queue_s, without.prefill_s, without.decode_s)
        );
        let engine_side = without.queue_s.expect("scheduled") + without.prefill_s.expect("prefilled");
        assert!((engine_side - without.ttft_s.expect("started")).abs() < 1e-9, "request {}", with.index);
    }

    // A sample: each request draws one of its values, the same ones for the same seed, others for another.
    let mut sampled = config.clone();
    sampled.profile.extra_latency_us = vec![0, 100_000];
    let added = |report: &replay::ReplayReport| -> Vec<u64> {
        report
            .per_request
            .iter()
            .zip(&base.per_request)
            .map(|(with, without)| {
                ((with.ttft_s.expect("started") - without.ttft_s.expect("started")) * 1e6).round() as u64
            })
            .collect()
    };
    let draws = added(&run(&sampled));
    assert!(draws.iter().all(|us| *us == 0 || *us == 100_000), "{draws:?}");
    let long = draws.iter().filter(|us| **us > 0).count();
    assert!((100..=200).contains(&long), "{long} of 300 drew 100 ms");
    assert_eq!(added(&run(&sampled)), draws, "the same seed draws the same");
    let mut other_seed = sampled.clone();
    other_seed.seed = 2;
    let other = run(&other_seed);
    // The seed also moves the policy's draws; where placement is the same, the draws differ somewhere.
    assert_ne!(
        other.per_request.iter().map(|r| r.ttft_s).collect::<Vec<_>>(),
        run(&sampled).per_request.iter().map(|r| r.ttft_s).collect::<Vec<_>>()
    );
}

#[test]
fn a_shared_host_slows_replicas_computing_at_once_and_none_computing_alone() {
    use fleet_sim::engine::SharedHost;
    // Two cold prompts at once on two replicas (round_robin), then two more 10 s apart.
    let trace = Trace::from_records(vec![
        TraceRecord::mooncake(0, 2048, 2, vec![1, 2, 3, 4]),
        TraceRecord::mooncake(0, 2048, 2, vec![5, 6, 7, 8]),
        TraceRecord::mooncake(10_000, 2048, 2, vec![9, 10, 11, 12]),
        TraceRecord::mooncake(20_000, 2048, 2, vec![13, 14, 15, 16]),
    ])
    .expect("valid");
    let prepared = replay::prepare(&trace, None, 1.0).expect("prepared");
    let replayed = |host: Option<SharedHost>| {
        let mut config = ReplayConfig::new(2, PolicySpec::named("round_robin"));
        config.profile.shared_host = host;
        let report = replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed");
        let ttfts: Vec<f64> = report.per_request.iter().map(|r| r.ttft_s.expect("started")).collect();
        let replicas: Vec<u32> = report.per_request.iter().map(|r| r.replica).collect();
        (ttfts, replicas)
    };
    let (alone, placement) = replayed(None);
    assert_ne!(placement[0], placement[1], "round_robin puts the first two on two replicas");
    assert!((alone[0] - alone[1]).abs() < 1e-9 && alone[0] > 0.0, "{alone:?}");

    // One core for two single-threaded replicas: the first two split it and take twice as long (to a
    // microsecond a step); the later ones compute alone, as fast as on their own accelerators.
    let (shared, same_placement) =
        replayed(Some(SharedHost { cores: 1.0, threads_per_replica: 1.0, oversubscribed_exponent: 1.0 }));
    assert_eq!(same_placement, placement);
    for request in 0..2 {
        assert!(
            (shared[request] - 2.0 * alone[request]).abs() < 1e-5,
            "request {request}: {shared:?} vs {alone:?}"
        );
    }
    assert_eq!(shared[2..], alone[2..]);

    // Cores enough for both: nothing slows.
    let (roomy, _) =
        replayed(Some(SharedHost { cores: 2.0, threads_per_replica: 1.0, oversubscribed_exponent: 1.0 }));
    assert_eq!(roomy, alone);

    // Replicas that lose more than their share of an oversubscribed core: squared, a quarter each.
    let (harsh, _) =
        replayed(Some(SharedHost { cores: 1.0, threads_per_replica: 1.0, oversubscribed_exponent: 2.0 }));
    for request in 0..2 {
        assert!((harsh[request] - 4.0 * alone[request]).abs() < 1e-5, "{harsh:?} vs {alone:?}");
    }
    assert_eq!(harsh[2..], alone[2..]);

    // A P/D replay does not model a shared host, and says so.
    let mut pd = pd_config(pd_spec(1, 1, 4), 1);
    pd.profile.shared_host =
        Some(SharedHost { cores: 1.0, threads_per_replica: 1.0, oversubscribed_exponent: 1.0 });
    let err = replay::replay(&prepared, &pd, ReplayControl::default()).expect_err("not modelled");
    assert!(err.to_string().contains("shared_host"), "{err}");
}

/// A policy spec with `pd:` thresholds.
fn pd_spec(min_prompt_tokens: u32, min_uncached_tokens: u32, max_prefill_queue: u32) -> PolicySpec {
    let mut spec = PolicySpec::named("cache_aware_approx");
    spec.pd.insert("min_prompt_tokens".into(), min_prompt_tokens.into());
    spec.pd.insert("min_uncached_tokens".into(), min_uncached_tokens.into());
    spec.pd.insert("max_prefill_queue".into(), max_prefill_queue.into());
    spec
}

fn pd_config(spec: PolicySpec, prefill_replicas: u32) -> ReplayConfig {
    ReplayConfig {
        pd: Some(replay::PdReplay { prefill_replicas, ..replay::PdReplay::default() }),
        ..ReplayConfig::new(2, spec)
    }
}

/// 512-token blocks, 10 s apart: a short prompt, a long one, the same long one again, another long one.
fn pd_trace() -> PreparedTrace {
    let trace = Trace::from_records(vec![
        TraceRecord::mooncake(0, 200, 4, vec![100]),
        TraceRecord::mooncake(10_000, 2048, 4, vec![1, 2, 3, 4]),
        TraceRecord::mooncake(20_000, 2048, 4, vec![1, 2, 3, 4]),
        TraceRecord::mooncake(30_000, 2048, 4, vec![5, 6, 7, 8]),
    ])
    .expect("valid");
    replay::prepare(&trace, None, 1.0).expect("prepared")
}

#[test]
fn a_pd_replay_splits_long_uncached_prompts_and_keeps_short_or_cached_ones_local() {
    let report = replay::replay(&pd_trace(), &pd_config(pd_spec(256, 512, 16), 1), ReplayControl::default())
        .expect("replayed");
    let pd = report.pd.as_ref().expect("a P/D report");
    let decisions: Vec<(&str, u64)> = pd.decisions.iter().map(|(r, n)| (r.as_str(), *n)).collect();
    // The repeat finds its blocks at the decode replica the first one was pulled into.
    assert_eq!(decisions, [("cached_at_decode", 1), ("short_prompt", 1), ("split", 2)]);
    assert_eq!(pd.split_share, 0.5);
    assert!(pd.transfer_mean_s > 0.0 && pd.prefill_leg_mean_s > pd.transfer_mean_s, "{pd:?}");
    // The prefill pool computed both split prompts whole (their last token again at the decode side).
    assert_eq!(pd.prefill_pool_tokens, 2 * 2048);
    // Every request was answered by a decode replica, and the repeat hit its cache.
    assert_eq!(report.requests, 4);
    assert_eq!(report.per_replica.iter().map(|r| r.requests).sum::<u64>(), 4);
    assert!(report.hit_rate > 0.0, "the repeat's 1536 cached tokens count: {report:?}");
    // Deterministic: the same configuration gives the same report.
    let again = replay::replay(&pd_trace(), &pd_config(pd_spec(256, 512, 16), 1), ReplayControl::default());
    assert_eq!(again.expect("replayed"), report);
}

#[test]
fn pd_thresholds_decide_how_much_is_split_and_a_split_costs_the_transfer() {
    let run = |spec: PolicySpec, prefill_replicas: u32| {
        replay::replay(&pd_trace(), &pd_config(spec, prefill_replicas), ReplayControl::default())
            .expect("replayed")
    };
    let never = run(pd_spec(100_000_000, 512, 16), 1);
    let pd = never.pd.as_ref().expect("a P/D report");
    assert_eq!((pd.decisions.get("short_prompt"), pd.prefill_pool_tokens), (Some(&4), 0));
    let always = run(pd_spec(0, 0, 1000), 1);
    assert_eq!(always.pd.as_ref().and_then(|p| p.decisions.get("split")), Some(&4), "{always:?}");
    // With no prefill replica nothing can split, whatever the thresholds.
    let none = run(pd_spec(0, 0, 1000), 0);
    assert_eq!(none.pd.as_ref().and_then(|p| p.decisions.get("no_prefill_replica")), Some(&4));
    // On an idle fleet a split request's first token waits for its prefill leg and the transfer too.
    assert!(always.ttft_p50_s > never.ttft_p50_s, "always {always:?} never {never:?}");
}

#[test]
fn a_request_too_large_for_a_decode_replica_is_named_not_dropped_after_its_prefill_leg() {
    // 12 blocks of 512 tokens per replica: the prompt (4 blocks) fits with one output token, not with 6000.
    let trace =
        Trace::from_records(vec![TraceRecord::mooncake(0, 2048, 6000, vec![1, 2, 3, 4])]).expect("valid");
    let prepared = replay::prepare(&trace, None, 1.0).expect("prepared");
    let config = ReplayConfig { capacity_blocks: Some(12), ..pd_config(pd_spec(0, 0, 1000), 1) };
    let err = replay::replay(&prepared, &config, ReplayControl::default()).expect_err("too large");
    assert!(matches!(err, ReplayError::TooLarge { index: 0, .. }), "{err}");
}

#[test]
fn least_load_by_expected_wait_stays_below_round_robin_on_a_hot_tenant_where_counting_requests_does_not() {
    // The skew bench's hot-tenant workload at 16 req/s (half the sessions share one long system prompt),
    // over 8 replicas of 2,000 blocks. Counting requests, least_load cannot tell the hot tenant's long
    // prompts from short ones and queues some replicas behind them: its TTFT p95 is above round_robin's.
    // Counting the prefill queued (and the decode held), it is below.
    let config =
        GenConfig { requests: 3000, rate_rps: 16.0, hot_tenant_share: Some(0.5), ..GenConfig::default() };
    let trace = Trace::from_records(generate(&config).expect("valid")).expect("valid");
    let prepared = replay::prepare(&trace, None, 1.0).expect("prepared");
    let p95 = |spec: PolicySpec| {
        let config = ReplayConfig { capacity_blocks: Some(2000), ..ReplayConfig::new(8, spec) };
        replay::replay(&prepared, &config, ReplayControl::default()).expect("replayed").ttft_p95_s
    };
    let round_robin = p95(PolicySpec::named("round_robin"));
    let by_wait = p95(PolicySpec::named("least_load"));
    let by_requests = p95(PolicySpec::named("least_load").with("load_metric", "requests"));
    assert!(by_wait < round_robin, "least_load (wait) {by_wait:.3} s, round_robin {round_robin:.3} s");
    assert!(
        by_requests > round_robin,
        "least_load (requests) {by_requests:.3} s, round_robin {round_robin:.3} s"
    );
}
