//! HTTP targets: HTTP/1.1 with one keep-alive connection per worker, or h2 (prior knowledge)
//! with the workers multiplexed over a few connections.

use std::sync::Mutex;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::{Answer, BenchError, Sender, Target, Template};

/// Which HTTP version to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.1, one connection per worker.
    Http1,
    /// h2 with prior knowledge, over `connections` connections.
    H2 {
        /// How many connections the workers share.
        connections: usize,
    },
}

/// An HTTP endpoint to load.
#[derive(Debug)]
pub struct HttpTarget {
    url: String,
    authority: Authority,
    path: Template,
    method: Method,
    headers: Vec<(HeaderName, Template)>,
    body: Option<Template>,
    version: Version,
    /// A 2xx answer whose body holds this text counts as limited: for services that answer a
    /// denial with `200` and a verdict in the body, as throttlecrab's `/throttle` does.
    limited_body: Option<Bytes>,
    /// h2 connections opened so far, shared round robin.
    shared: Mutex<Vec<http2::SendRequest<Full<Bytes>>>>,
}

impl HttpTarget {
    /// A target at `url` (`http://host:port/path?query`, with `{n}` placeholders allowed after
    /// the authority). `headers` are `name: value` lines; a `body` is sent as JSON unless a
    /// `content-type` header says otherwise. `keys` bounds `{n}`, so every URL the run will make
    /// is checked here.
    pub fn new(
        url: &str,
        method: Method,
        headers: &[String],
        body: Option<String>,
        version: Version,
        keys: u64,
    ) -> Result<Self, BenchError> {
        let invalid = |m: String| BenchError::Invalid(m);
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            invalid(format!(
                "the URL {url:?} must start with http:// (TLS is not supported)"
            ))
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let authority: Authority = authority
            .parse()
            .map_err(|e| invalid(format!("the URL {url:?} has an invalid host: {e}")))?;
        if authority.port_u16().is_none() {
            return Err(invalid(format!("the URL {url:?} needs a port")));
        }
        let path = Template::new(path);
        for n in [0, keys.saturating_sub(1)] {
            let rendered = path.render(n);
            rendered
                .parse::<Uri>()
                .map_err(|e| invalid(format!("the URL path {rendered:?} is invalid: {e}")))?;
        }
        let mut parsed = Vec::new();
        for line in headers {
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| invalid(format!("the header {line:?} is not `name: value`")))?;
            let name: HeaderName = name
                .trim()
                .parse()
                .map_err(|e| invalid(format!("the header name in {line:?} is invalid: {e}")))?;
            let value = Template::new(value.trim());
            HeaderValue::from_str(&value.render(0))
                .map_err(|e| invalid(format!("the header value in {line:?} is invalid: {e}")))?;
            parsed.push((name, value));
        }
        if let Version::H2 { connections: 0 } = version {
            return Err(invalid("h2 needs at least one connection".into()));
        }
        Ok(HttpTarget {
            url: url.to_owned(),
            authority,
            path,
            method,
            headers: parsed,
            body: body.map(|b| Template::new(&b)),
            version,
            limited_body: None,
            shared: Mutex::new(Vec::new()),
        })
    }

    /// Counts a 2xx answer as limited when its body contains `text` (e.g. `"allowed":false`),
    /// for services that answer every check with `200` and put the verdict in the body. An
    /// empty text is refused: every body would contain it.
    pub fn limited_if_body_contains(mut self, text: &str) -> Result<Self, BenchError> {
        if text.is_empty() {
            return Err(BenchError::Invalid(
                "the text that marks a limited answer must not be empty".into(),
            ));
        }
        self.limited_body = Some(Bytes::copy_from_slice(text.as_bytes()));
        Ok(self)
    }

    fn request(&self, key: u64) -> Result<Request<Full<Bytes>>, String> {
        let uri: Uri = self
            .path
            .render(key)
            .parse()
            .map_err(|_| "invalid URI".to_owned())?;
        let body = self
            .body
            .as_ref()
            .map_or_else(Bytes::new, |b| Bytes::from(b.render(key)));
        let mut builder = Request::builder().method(self.method.clone());
        match self.version {
            Version::Http1 => builder = builder.uri(uri).header(HOST, self.authority.as_str()),
            Version::H2 { .. } => {
                let full = Uri::builder()
                    .scheme("http")
                    .authority(self.authority.clone())
                    .path_and_query(uri.path_and_query().map_or("/", |p| p.as_str()))
                    .build()
                    .map_err(|_| "invalid URI".to_owned())?;
                builder = builder.uri(full);
            }
        }
        let mut typed = false;
        for (name, value) in &self.headers {
            typed |= name == CONTENT_TYPE;
            builder = builder.header(name, value.render(key));
        }
        if self.body.is_some() && !typed {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        builder
            .body(Full::new(body))
            .map_err(|e| format!("request: {e}"))
    }

    async fn connect(&self) -> Result<TokioIo<TcpStream>, String> {
        let stream = TcpStream::connect(self.authority.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        Ok(TokioIo::new(stream))
    }

    async fn open_http1(&self) -> Result<http1::SendRequest<Full<Bytes>>, String> {
        let io = self.connect().await?;
        let (send, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(send)
    }

    async fn open_h2(&self) -> Result<http2::SendRequest<Full<Bytes>>, String> {
        let io = self.connect().await?;
        let (send, conn) = http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(send)
    }
}

/// A worker's side of an HTTP target.
pub(crate) struct HttpSender {
    target: std::sync::Arc<HttpTarget>,
    conn: Conn,
}

enum Conn {
    Http1(Option<http1::SendRequest<Full<Bytes>>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Target for std::sync::Arc<HttpTarget> {
    type Sender = HttpSender;

    async fn open(&self, index: usize) -> Result<HttpSender, String> {
        let conn = match self.version {
            Version::Http1 => Conn::Http1(Some(self.open_http1().await?)),
            Version::H2 { connections } => {
                let existing = {
                    let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
                    (shared.len() >= connections).then(|| shared[index % connections].clone())
                };
                match existing {
                    Some(send) => Conn::H2(send),
                    None => {
                        let send = self.open_h2().await?;
                        self.shared
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(send.clone());
                        Conn::H2(send)
                    }
                }
            }
        };
        Ok(HttpSender {
            target: self.clone(),
            conn,
        })
    }

    fn describe(&self) -> String {
        let version = match self.version {
            Version::Http1 => "HTTP/1.1".to_owned(),
            Version::H2 { connections } => format!("h2 over {connections} connection(s)"),
        };
        format!("{} {} ({version})", self.method, self.url)
    }
}

impl Sender for HttpSender {
    async fn send(&mut self, key: u64) -> Answer {
        let request = match self.target.request(key) {
            Ok(r) => r,
            Err(e) => return Answer::Error(e),
        };
        let response = match &mut self.conn {
            Conn::Http1(slot) => {
                // A connection that failed is replaced before the next request.
                let mut send = match slot.take() {
                    Some(s) if !s.is_closed() => s,
                    _ => match self.target.open_http1().await {
                        Ok(s) => s,
                        Err(e) => return Answer::Error(format!("connect: {e}")),
                    },
                };
                if send.ready().await.is_err() {
                    return Answer::Error("connection closed".into());
                }
                let r = send.send_request(request).await;
                *slot = Some(send);
                r
            }
            Conn::H2(send) => {
                if send.ready().await.is_err() {
                    return Answer::Error("connection closed".into());
                }
                send.send_request(request).await
            }
        };
        match response {
            Ok(response) => {
                let status = response.status();
                let body = match response.into_body().collect().await {
                    Ok(body) => body,
                    Err(_) => return Answer::Error("body cut short".into()),
                };
                let answer = classify(status);
                match &self.target.limited_body {
                    Some(text) if answer == Answer::Allowed => {
                        if contains(&body.to_bytes(), text) {
                            Answer::Limited
                        } else {
                            answer
                        }
                    }
                    _ => answer,
                }
            }
            Err(e) => Answer::Error(format!("request: {e}")),
        }
    }
}

/// Whether `needle` (not empty) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn classify(status: StatusCode) -> Answer {
    if status.is_success() {
        Answer::Allowed
    } else if status == StatusCode::TOO_MANY_REQUESTS {
        Answer::Limited
    } else {
        Answer::Error(format!("HTTP {}", status.as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str, headers: &[&str]) -> Result<HttpTarget, BenchError> {
        let headers: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
        HttpTarget::new(url, Method::GET, &headers, None, Version::Http1, 10)
    }

    #[test]
    fn bad_urls_and_headers_are_refused_with_a_reason() {
        for (url, headers, why) in [
            ("https://127.0.0.1:1/", &[][..], "http://"),
            ("http://127.0.0.1/", &[], "port"),
            ("http://127.0.0.1:80/a b", &[], "invalid"),
            ("http://127.0.0.1:80/", &["no-colon"], "name: value"),
            ("http://127.0.0.1:80/", &["bad name: x"], "header name"),
        ] {
            let e = target(url, headers).expect_err(url).to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn requests_render_the_key_into_path_headers_and_body() {
        let t = HttpTarget::new(
            "http://127.0.0.1:8080/json?u={n}",
            Method::POST,
            &["x-user: u{n}".into()],
            Some(r#"{"user":"u{n}"}"#.into()),
            Version::Http1,
            10,
        )
        .unwrap();
        let r = t.request(7).unwrap();
        assert_eq!(r.uri(), "/json?u=7");
        assert_eq!(r.headers()["x-user"], "u7");
        assert_eq!(r.headers()[HOST], "127.0.0.1:8080");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
    }

    #[test]
    fn a_verdict_in_the_body_is_found_and_an_empty_one_refused() {
        assert!(contains(
            br#"{"allowed":false,"limit":3}"#,
            br#""allowed":false"#
        ));
        assert!(!contains(br#"{"allowed":true}"#, br#""allowed":false"#));
        assert!(!contains(b"", b"x"));
        let e = target("http://127.0.0.1:80/", &[])
            .unwrap()
            .limited_if_body_contains("")
            .expect_err("an empty text")
            .to_string();
        assert!(e.contains("must not be empty"), "{e}");
    }

    #[test]
    fn statuses_are_classified() {
        assert_eq!(classify(StatusCode::NO_CONTENT), Answer::Allowed);
        assert_eq!(classify(StatusCode::TOO_MANY_REQUESTS), Answer::Limited);
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY),
            Answer::Error("HTTP 502".into())
        );
    }
}
