//! A minimal HTTP/1.1 GET for hubs served over `http://` (no TLS): bounded in time and size,
//! nothing kept but the body. A hub on an untrusted network is pinned by hash
//! (`--expect-hash`, the lockfile), not trusted by transport.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long connecting, and each read or write, may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of status line and headers.
const MAX_HEAD: usize = 64 << 10;

/// `url`'s body when the server answers 200 with at most `max` bytes; otherwise why not.
pub fn get(url: &str, max: u64) -> Result<Vec<u8>, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url}: only http:// URLs are fetched"))?;
    let (authority, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let port: u16 = match authority.rsplit_once(':') {
        Some((_, p)) => p.parse().map_err(|_| format!("{url}: port {p:?} is not a number"))?,
        None => 80,
    };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{url}: cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{url}: {host} has no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("{url}: cannot connect: {e}"))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: layerzero\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).map_err(|e| format!("{url}: sending the request: {e}"))?;
    let mut reader = stream.take(MAX_HEAD as u64 + max + 1);
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 8192];
        let n = reader.read(&mut chunk).map_err(|e| format!("{url}: reading the response: {e}"))?;
        if n == 0 {
            return Err(format!("{url}: the connection closed before the headers ended"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("{url}: the response headers exceed {MAX_HEAD} bytes"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        return Err(format!("{url}: the server answered {status:?}"));
    }
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    if header("transfer-encoding").is_some_and(|v| !v.eq_ignore_ascii_case("identity")) {
        return Err(format!("{url}: chunked or encoded responses are not read; serve files with a Content-Length"));
    }
    let length: Option<u64> =
        header("content-length").map(|v| v.parse().map_err(|_| format!("{url}: Content-Length {v:?}"))).transpose()?;
    if let Some(n) = length
        && n > max
    {
        return Err(format!("{url}: {n} bytes; at most {max} are read"));
    }
    let mut body = buf.split_off(head_end + 4);
    reader.read_to_end(&mut body).map_err(|e| format!("{url}: reading the body: {e}"))?;
    if body.len() as u64 > max {
        return Err(format!("{url}: more than {max} bytes; refused"));
    }
    if let Some(n) = length
        && body.len() as u64 != n
    {
        return Err(format!("{url}: {} of {n} bytes arrived", body.len()));
    }
    Ok(body)
}
