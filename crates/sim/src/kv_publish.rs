//! Publishing a replica's KV-cache events over ZMQ exactly as vLLM's `ZmqEventPublisher` does.
//!
//! Per replica: a PUB socket sending `[topic, seq (8 bytes big-endian, from 0), msgpack batch]`
//! per engine step with KV events, and a ROUTER replay socket answering "send me everything from
//! seq N" with the buffered `[seq, payload]` messages and an end marker (`fleet_kv_events::replay`).
//!
//! Ports follow vLLM's data-parallel convention: with `--kv-events tcp://HOST:P`, replica `i`
//! publishes on `P + i`; its replay socket listens on `R + i`, where `R` is
//! `--kv-events-replay-port` or, by default, `P + replicas` (the range right after the PUB
//! ports). Port 0 binds a free port per socket (tests); the bound endpoints are reported.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::str::FromStr;

use bytes::Bytes;
use fleet_kv_events::{self as wire, Encoding};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay (vLLM's `buffer_steps` default).
pub const REPLAY_BUFFER_STEPS: usize = 10_000;
/// Batches queued between the engine and the socket before new ones are dropped.
pub const PUBLISH_QUEUE: usize = 4_096;

/// Where the first replica publishes: `tcp://HOST:PORT`, with `*` for every interface as vLLM
/// writes it. A bare `PORT` means loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEndpoint {
    pub host: IpAddr,
    pub port: u16,
}

impl FromStr for KvEndpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "expected tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557 or tcp://*:5557) or a bare PORT";
        if let Ok(port) = s.parse::<u16>() {
            return Ok(Self { host: IpAddr::from([127, 0, 0, 1]), port });
        }
        let rest = s
            .strip_prefix("tcp://")
            .ok_or_else(|| format!("{s:?}: only tcp:// endpoints are served; {usage}"))?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| format!("{s:?} has no port; {usage}"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{s:?}: port {port:?} is not a number 0-65535; {usage}"))?;
        let host = match host.trim_start_matches('[').trim_end_matches(']') {
            "*" => IpAddr::from([0, 0, 0, 0]),
            "" | "localhost" => IpAddr::from([127, 0, 0, 1]),
            ip => ip.parse().map_err(|_| format!("{s:?}: host {ip:?} is not an IP address or *; {usage}"))?,
        };
        Ok(Self { host, port })
    }
}

/// KV event publishing for a fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    pub endpoint: KvEndpoint,
    /// First replay port; `None` = right after the PUB range (0 stays 0).
    pub replay_port: Option<u16>,
    pub encoding: Encoding,
    /// vLLM's `topic` (empty by default).
    pub topic: String,
}

impl KvEventsConfig {
    pub fn new(endpoint: KvEndpoint) -> Self {
        Self { endpoint, replay_port: None, encoding: Encoding::default(), topic: String::new() }
    }

    /// The (PUB, replay) ports of replica `index` in a fleet of `replicas`.
    pub fn ports(&self, index: u16, replicas: u16) -> Result<(u16, u16), KvPublishError> {
        let offset = |base: u16, what: &'static str| {
            if base == 0 { Ok(0) } else { base.checked_add(index).ok_or(KvPublishError::PortRange { what }) }
        };
        let replay_base = match self.replay_port {
            Some(port) => port,
            None if self.endpoint.port == 0 => 0,
            None => self
                .endpoint
                .port
                .checked_add(replicas)
                .ok_or(KvPublishError::PortRange { what: "default replay port (kv port + replicas)" })?,
        };
        Ok((offset(self.endpoint.port, "kv events port")?, offset(replay_base, "replay port")?))
    }
}

/// Why publishing could not start.
#[derive(Debug, thiserror::Error)]
pub enum KvPublishError {
    #[error("{what} + replica index runs past port 65535; pick a lower port")]
    PortRange { what: &'static str },
    #[error("cannot bind the KV events {what} socket on {endpoint}: {source}")]
    Bind { what: &'static str, endpoint: String, source: zeromq::ZmqError },
}

/// The endpoints one replica actually bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEndpoints {
    pub publish: String,
    pub replay: String,
}

fn format_endpoint(host: IpAddr, port: u16) -> String {
    match host {
        IpAddr::V4(ip) => format!("tcp://{ip}:{port}"),
        IpAddr::V6(ip) => format!("tcp://[{ip}]:{port}"),
    }
}

/// Binds replica `index`'s PUB and replay sockets and starts publishing what arrives on the
/// returned sender until `shutdown`.
pub async fn start(
    config: &KvEventsConfig,
    index: u16,
    replicas: u16,
    shutdown: CancellationToken,
) -> Result<(mpsc::Sender<wire::EventBatch>, KvEndpoints), KvPublishError> {
    let (pub_port, replay_port) = config.ports(index, replicas)?;
    let mut publisher = zeromq::PubSocket::new();
    let wanted = format_endpoint(config.endpoint.host, pub_port);
    let bound = publisher.bind(&wanted).await.map_err(|source| KvPublishError::Bind {
        what: "PUB",
        endpoint: wanted.clone(),
        source,
    })?;
    let mut replay = zeromq::RouterSocket::new();
    let wanted_replay = format_endpoint(config.endpoint.host, replay_port);
    let bound_replay = replay.bind(&wanted_replay).await.map_err(|source| KvPublishError::Bind {
        what: "replay ROUTER",
        endpoint: wanted_replay.clone(),
        source,
    })?;
    let endpoints = KvEndpoints { publish: bound.to_string(), replay: bound_replay.to_string() };
    let (tx, rx) = mpsc::channel(PUBLISH_QUEUE);
    let publisher = Publisher {
        publisher,
        replay,
        topic: Bytes::from(config.topic.clone().into_bytes()),
        encoding: config.encoding,
        next_seq: 0,
        buffer: VecDeque::new(),
    };
    tokio::spawn(publisher.run(rx, shutdown));
    Ok((tx, endpoints))
}

struct Publisher {
    publisher: zeromq::PubSocket,
    replay: zeromq::RouterSocket,
    topic: Bytes,
    encoding: Encoding,
    next_seq: u64,
    buffer: VecDeque<(u64, Bytes)>,
}

impl Publisher {
    async fn run(mut self, mut batches: mpsc::Receiver<wire::EventBatch>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                batch = batches.recv() => {
                    let Some(batch) = batch else { break };
                    self.publish(&batch).await;
                }
                request = self.replay.recv() => match request {
                    Ok(request) => self.serve_replay(request).await,
                    Err(error) => tracing::debug!(%error, "replay socket receive failed"),
                },
            }
        }
        let _ = self.publisher.close().await;
        let _ = self.replay.close().await;
    }

    async fn publish(&mut self, batch: &wire::EventBatch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(wire::encode_batch(batch, self.encoding));
        let message = zmq_message(wire::publish_frames(&self.topic, seq, &payload));
        if let Err(error) = self.publisher.send(message).await {
            tracing::warn!(%error, seq, "KV event publish failed; the batch stays available for replay");
        }
        if self.buffer.len() == REPLAY_BUFFER_STEPS {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload));
    }

    async fn serve_replay(&mut self, request: ZmqMessage) {
        let frames: Vec<Bytes> = request.into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        let request = match wire::replay::parse_request(&refs) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(%error, "ignoring a malformed KV replay request");
                return;
            }
        };
        let replies = self
            .buffer
            .iter()
            .filter(|(seq, _)| *seq >= request.start_seq)
            .map(|(seq, payload)| wire::replay::batch_frames(&request.identity, *seq, payload))
            .chain(std::iter::once(wire::replay::end_frames(&request.identity)))
            .map(zmq_message)
            .collect::<Vec<_>>();
        for message in replies {
            if let Err(error) = self.replay.send(message).await {
                tracing::debug!(%error, "replay client went away");
                return;
            }
        }
    }
}

/// A multipart ZMQ message from frames laid out by fleet-kv-events (the wire layout lives there).
fn zmq_message(frames: impl IntoIterator<Item = Vec<u8>>) -> ZmqMessage {
    let frames: std::collections::VecDeque<Bytes> = frames.into_iter().map(Bytes::from).collect();
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_like_vllm_writes_them() {
        assert_eq!(
            "tcp://*:5557".parse::<KvEndpoint>().unwrap(),
            KvEndpoint { host: [0, 0, 0, 0].into(), port: 5557 }
        );
        assert_eq!("5557".parse::<KvEndpoint>().unwrap().host, IpAddr::from([127, 0, 0, 1]));
        assert_eq!("tcp://127.0.0.1:0".parse::<KvEndpoint>().unwrap().port, 0);
        assert!("ipc:///tmp/x".parse::<KvEndpoint>().unwrap_err().contains("tcp://"));
        assert!("tcp://host:abc".parse::<KvEndpoint>().unwrap_err().contains("port"));
    }

    #[test]
    fn replica_ports_follow_the_data_parallel_convention() {
        let config = KvEventsConfig::new("tcp://*:5557".parse().unwrap());
        assert_eq!(config.ports(0, 4).unwrap(), (5557, 5561));
        assert_eq!(config.ports(3, 4).unwrap(), (5560, 5564));
        let explicit = KvEventsConfig { replay_port: Some(6000), ..config.clone() };
        assert_eq!(explicit.ports(2, 4).unwrap(), (5559, 6002));
        let free = KvEventsConfig::new("tcp://127.0.0.1:0".parse().unwrap());
        assert_eq!(free.ports(7, 8).unwrap(), (0, 0));
        let high = KvEventsConfig::new("tcp://*:65534".parse().unwrap());
        assert!(high.ports(3, 4).is_err());
    }
}
