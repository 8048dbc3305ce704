//! fleet-sim's one integration test binary: real servers on 127.0.0.1 port 0, real processes,
//! real clients (reqwest, Python's openai / prometheus_client / pyzmq + msgpack, promtool).

#[path = "sim/bench.rs"]
mod bench;
#[path = "sim/model.rs"]
mod model;
#[path = "sim/replay.rs"]
mod replay;
#[path = "sim/serve.rs"]
mod serve;
#[path = "sim/serve_faults.rs"]
mod serve_faults;
#[path = "sim/serve_kv.rs"]
mod serve_kv;
#[path = "sim/serve_pd.rs"]
mod serve_pd;
#[path = "sim/serve_scale.rs"]
mod serve_scale;
