//! The one reader of an HTTP response body capped in size (feature `http`): every client that reads a
//! peer's answer into memory (etcd, the routers' admin API, fleet-sim's bench, fleet-router's model
//! lookup) goes through it, so none can be made to buffer without bound.

use futures_util::StreamExt;

use crate::error::error_chain;

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Larger than the limit: announced by Content-Length, or found while streaming.
    #[error("the body is larger than the limit")]
    TooLarge,
    /// The connection failed mid-body; the error and its causes ([`error_chain`]).
    #[error("the body broke off: {0}")]
    Broken(String),
}

/// Reads `response`'s body of at most `limit` bytes, refusing at once a larger Content-Length and
/// stopping as soon as the streamed bytes pass the limit.
pub async fn read_limited(response: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Broken(error_chain(&e)))?;
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// Serves one connection with `answer` (raw HTTP/1.1 bytes) and closes it; returns the URL.
    fn answer_once(answer: &'static [u8]) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut connection, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = connection.read(&mut request);
            let _ = connection.write_all(answer);
        });
        url
    }

    async fn read(answer: &'static [u8], limit: usize) -> Result<Vec<u8>, BodyError> {
        let response = reqwest::get(answer_once(answer)).await.unwrap();
        read_limited(response, limit).await
    }

    #[tokio::test]
    async fn bodies_are_read_up_to_the_limit_and_refused_beyond() {
        let sized = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
        assert_eq!(read(sized, 5).await, Ok(b"hello".to_vec()));
        assert_eq!(read(sized, 4).await, Err(BodyError::TooLarge), "announced too large");
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
        assert_eq!(read(chunked, 6).await, Ok(b"abcdef".to_vec()));
        assert_eq!(read(chunked, 5).await, Err(BodyError::TooLarge), "streamed past the limit");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_broken_with_its_cause() {
        let cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\nonly ten b";
        match read(cut, 1000).await {
            Err(BodyError::Broken(detail)) => assert!(detail.contains(": "), "the chain: {detail}"),
            other => panic!("expected Broken, got {other:?}"),
        }
    }
}
