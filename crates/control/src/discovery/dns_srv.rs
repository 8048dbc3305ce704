//! DNS SRV lookups for discovery (`_vllm._tcp.fleet.internal` -> replicas at `host:port`): the DNS
//! message format for one SRV or A question and its answer, pure, and one bounded exchange over UDP (TCP
//! when the answer is truncated).
//!
//! Hand-written rather than a resolver crate: two record types over one server is ~200 lines, where a
//! full resolver would add a large dependency tree to a workspace that builds on two cores. It reads
//! compressed names (with a bound on pointer hops), refuses malformed messages with a reason, never panics
//! on any input, and takes the A records the server adds to an SRV answer (dnsmasq, CoreDNS and Consul do),
//! asking for the others.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Record types read here.
const TYPE_A: u16 = 1;
const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;
/// Time allowed for one exchange.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Largest answer accepted over TCP (UDP answers are bounded by the datagram).
const MAX_TCP_ANSWER: usize = 64 << 10;

/// One SRV record: a service instance at `target:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// The host name, without the trailing dot.
    pub target: String,
}

/// What an answer holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The SRV records (answer section).
    pub srv: Vec<Srv>,
    /// Address records of any section, by name (lower case, no trailing dot).
    pub addresses: Vec<(String, Ipv4Addr)>,
    /// The server cut the answer short (TC): ask again over TCP.
    pub truncated: bool,
}

/// A question for `name` of type `record_type`, with id `id`.
pub fn query(id: u16, name: &str, record_type: u16) -> Result<Vec<u8>, String> {
    let mut message = Vec::with_capacity(512);
    // Header: id, flags (recursion desired), one question.
    for field in [id, 0x0100, 1, 0, 0, 0] {
        message.extend_from_slice(&field.to_be_bytes());
    }
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(format!("{name:?} is not a DNS name (empty or overlong label)"));
        }
        message.push(label.len() as u8);
        message.extend_from_slice(label.as_bytes());
    }
    message.push(0);
    message.extend_from_slice(&record_type.to_be_bytes());
    message.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(message)
}

/// A cursor over a message that fails instead of reading past its end.
struct Reader<'a> {
    message: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.message.len())
            .ok_or("the answer is cut short")?;
        let slice = &self.message[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A possibly compressed name; the cursor moves past its in-place part.
    fn name(&mut self) -> Result<String, String> {
        let mut labels: Vec<String> = Vec::new();
        let mut at = self.at;
        let mut jumped = false;
        for _ in 0..128 {
            let len = *self.message.get(at).ok_or("a name runs past the answer")? as usize;
            match len {
                0 => {
                    if !jumped {
                        self.at = at + 1;
                    }
                    return Ok(labels.join(".").to_ascii_lowercase());
                }
                l if l & 0xc0 == 0xc0 => {
                    let low =
                        *self.message.get(at + 1).ok_or("a name pointer runs past the answer")? as usize;
                    if !jumped {
                        self.at = at + 2;
                    }
                    jumped = true;
                    at = ((l & 0x3f) << 8) | low;
                }
                l if l & 0xc0 == 0 => {
                    let label =
                        self.message.get(at + 1..at + 1 + l).ok_or("a name label runs past the answer")?;
                    labels.push(String::from_utf8_lossy(label).into_owned());
                    at += 1 + l;
                }
                _ => return Err("a name uses a label type DNS does not define".to_owned()),
            }
        }
        Err("a name has too many labels or pointers (a loop?)".to_owned())
    }
}

/// Reads the answer to the question with `id`. NXDOMAIN is an empty answer (the service has no instances);
/// other error codes are errors naming the code.
pub fn parse_answer(message: &[u8], id: u16) -> Result<Answer, String> {
    let mut reader = Reader { message, at: 0 };
    let answer_id = reader.u16()?;
    let flags = reader.u16()?;
    if answer_id != id || flags & 0x8000 == 0 {
        return Err("the reply does not answer this question (id or QR bit)".to_owned());
    }
    let rcode = flags & 0x000f;
    let mut answer = Answer { truncated: flags & 0x0200 != 0, ..Answer::default() };
    match rcode {
        0 => {}
        3 => return Ok(answer),
        2 => return Err("the DNS server failed (SERVFAIL)".to_owned()),
        5 => return Err("the DNS server refused the question (REFUSED)".to_owned()),
        other => return Err(format!("the DNS server answered with error code {other}")),
    }
    let questions = reader.u16()?;
    let answers = reader.u16()?;
    let authority = reader.u16()?;
    let additional = reader.u16()?;
    for _ in 0..questions {
        reader.name()?;
        reader.bytes(4)?;
    }
    for section in 0..3 {
        let count = [answers, authority, additional][section];
        for _ in 0..count {
            let name = reader.name()?;
            let record_type = reader.u16()?;
            let class = reader.u16()?;
            reader.bytes(4)?;
            let length = reader.u16()? as usize;
            let data_at = reader.at;
            let data = reader.bytes(length)?;
            if class != CLASS_IN {
                continue;
            }
            match record_type {
                TYPE_A if length == 4 => {
                    answer.addresses.push((name, Ipv4Addr::new(data[0], data[1], data[2], data[3])));
                }
                TYPE_SRV if section == 0 && length >= 7 => {
                    let mut srv = Reader { message, at: data_at };
                    let priority = srv.u16()?;
                    let weight = srv.u16()?;
                    let port = srv.u16()?;
                    let target = srv.name()?;
                    answer.srv.push(Srv { priority, weight, port, target });
                }
                _ => {}
            }
        }
    }
    Ok(answer)
}

/// One question to `server`, over UDP, again over TCP when the answer is truncated; bounded by [`TIMEOUT`].
pub async fn ask(server: SocketAddr, name: &str, record_type: u16) -> Result<Answer, String> {
    // Not a security boundary (the server is the operator's), just enough to tell answers apart.
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let id = (std::process::id() as u16) ^ (nanos as u16) ^ ((nanos >> 16) as u16);
    let question = query(id, name, record_type)?;
    let exchange = async {
        let bind: SocketAddr =
            if server.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().map_err(|_| "bind")?;
        let socket = tokio::net::UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
        socket.connect(server).await.map_err(|e| e.to_string())?;
        socket.send(&question).await.map_err(|e| e.to_string())?;
        let mut buffer = vec![0u8; 4096];
        loop {
            let n = socket.recv(&mut buffer).await.map_err(|e| e.to_string())?;
            // A stray datagram (another id) is ignored, not taken for the answer.
            match parse_answer(&buffer[..n], id) {
                Err(e) if e.contains("does not answer") => continue,
                other => return other,
            }
        }
    };
    let answer = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("the DNS server {server} did not answer within {TIMEOUT:?}"))??;
    if !answer.truncated {
        return Ok(answer);
    }
    let over_tcp = async {
        let mut stream = tokio::net::TcpStream::connect(server).await.map_err(|e| e.to_string())?;
        let mut framed = (question.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&question);
        stream.write_all(&framed).await.map_err(|e| e.to_string())?;
        let length = stream.read_u16().await.map_err(|e| e.to_string())? as usize;
        if length > MAX_TCP_ANSWER {
            return Err(format!("the DNS answer over TCP is {length} bytes, above {MAX_TCP_ANSWER}"));
        }
        let mut buffer = vec![0u8; length];
        stream.read_exact(&mut buffer).await.map_err(|e| e.to_string())?;
        parse_answer(&buffer, id)
    };
    tokio::time::timeout(TIMEOUT, over_tcp)
        .await
        .map_err(|_| format!("the DNS server {server} did not answer over TCP within {TIMEOUT:?}"))?
}

/// The instances of SRV name `name`: `(address, port)` each, sorted, asking `server` for the addresses the
/// SRV answer did not carry.
pub async fn resolve_srv(server: SocketAddr, name: &str) -> Result<Vec<(Ipv4Addr, u16)>, String> {
    let answer = ask(server, name, TYPE_SRV).await?;
    let mut instances = Vec::new();
    for srv in &answer.srv {
        let mut addresses: Vec<Ipv4Addr> =
            answer.addresses.iter().filter(|(n, _)| *n == srv.target).map(|(_, a)| *a).collect();
        if addresses.is_empty() {
            addresses =
                ask(server, &srv.target, TYPE_A).await?.addresses.into_iter().map(|(_, a)| a).collect();
        }
        instances.extend(addresses.into_iter().map(|address| (address, srv.port)));
    }
    instances.sort();
    instances.dedup();
    Ok(instances)
}

/// The first `nameserver` of a resolv.conf text.
pub fn nameserver(resolv_conf: &str) -> Option<SocketAddr> {
    resolv_conf.lines().find_map(|line| {
        let address = line.trim().strip_prefix("nameserver")?.trim();
        address.parse::<std::net::IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// dnsmasq 2.89's answer to `_vllm._tcp.fleet.test SRV` (two instances, their A records added).
    const DNSMASQ: &str = "123485800001000200000002055f766c6c6d045f74637005666c65657404746573740000210001c00c00210001000000000015000000001fa502723105666c656574047465737400c00c00210001000000000015000000001fa402723005666c656574047465737400c05a000100010000000000047f000001c039000100010000000000047f000002";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn a_real_answer_is_read_with_its_added_addresses() {
        let answer = parse_answer(&hex(DNSMASQ), 0x1234).unwrap();
        let targets: Vec<(&str, u16)> = answer.srv.iter().map(|s| (s.target.as_str(), s.port)).collect();
        assert_eq!(targets, [("r1.fleet.test", 8101), ("r0.fleet.test", 8100)]);
        assert_eq!(
            answer.addresses,
            [
                ("r0.fleet.test".to_owned(), Ipv4Addr::new(127, 0, 0, 1)),
                ("r1.fleet.test".to_owned(), Ipv4Addr::new(127, 0, 0, 2))
            ]
        );
        assert!(!answer.truncated);
        assert!(parse_answer(&hex(DNSMASQ), 0x9999).is_err());
    }

    #[test]
    fn questions_are_encoded_and_bad_names_refused() {
        let q = query(0x1234, "_vllm._tcp.fleet.test", TYPE_SRV).unwrap();
        assert_eq!(&q[..12], &hex("123401000001000000000000")[..]);
        assert_eq!(&q[q.len() - 4..], &[0, 33, 0, 1]);
        assert!(query(1, "a..b", TYPE_A).is_err());
        assert!(query(1, &"x".repeat(64), TYPE_A).is_err());
    }

    #[test]
    fn broken_answers_are_errors_not_panics() {
        let good = hex(DNSMASQ);
        for cut in 0..good.len() {
            let _ = parse_answer(&good[..cut], 0x1234);
        }
        // A pointer to itself: a loop.
        let mut looped = hex("123481800001000000000000c00c");
        looped.extend_from_slice(&[0, 33, 0, 1]);
        assert!(parse_answer(&looped, 0x1234).is_err());
        let nxdomain = hex("123481830000000000000000");
        assert_eq!(parse_answer(&nxdomain, 0x1234).unwrap(), Answer::default());
        let servfail = hex("123481820000000000000000");
        assert!(parse_answer(&servfail, 0x1234).unwrap_err().contains("SERVFAIL"));
    }

    #[test]
    fn the_nameserver_comes_from_resolv_conf() {
        let conf = "# generated\nsearch lan\nnameserver 10.0.0.2\nnameserver 1.1.1.1\n";
        assert_eq!(nameserver(conf), Some("10.0.0.2:53".parse().unwrap()));
        assert_eq!(nameserver("search lan\n"), None);
    }
}
