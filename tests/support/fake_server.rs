//! A tiny OpenAI-compatible HTTP/1.1 server for provider tests: real sockets on 127.0.0.1, one
//! scripted behaviour per accepted request (as the original's mock server,
//! `reference/session-llm.md` §7.6), every request captured, and every connection the *client*
//! closed counted, so a test can prove that cancellation really dropped the connection.
//!
//! Streams use chunked transfer encoding, so a clean end (`0\r\n\r\n`) and an abrupt disconnect are
//! distinguishable on the client side, exactly as with a real server. By default every response
//! carries `connection: close`: one request per connection keeps the "client closed it" signal
//! unambiguous. `start_keep_alive` instead keeps cleanly ended streams' connections open for the next
//! request, and `n_connections` tells whether the client reused them.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// One step of a streamed body.
#[derive(Clone, Debug)]
pub enum Step {
    /// Written as one HTTP chunk and flushed.
    Write(Vec<u8>),
    /// A pause; a client that closes meanwhile is noticed.
    Sleep(Duration),
}

/// How a streamed body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The terminating zero-length chunk: a clean end of body.
    Clean,
    /// The socket is closed without the terminating chunk.
    Disconnect,
    /// Nothing more is sent; the connection is held until the client closes it.
    Stall,
}

/// What the server does with one request.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// A complete response with a content-length body.
    Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// A 200 `text/event-stream` response written step by step.
    Stream { steps: Vec<Step>, ending: Ending },
    /// Reads the request and never answers, until the client closes.
    StallBeforeHeaders,
    /// Reads the request and closes the socket without a response.
    DropBeforeHeaders,
}

impl Behaviour {
    /// An error response with a JSON (or any) body and extra headers.
    pub fn status(status: u16, body: &str, headers: &[(&str, &str)]) -> Behaviour {
        Behaviour::Reply {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    /// A stream whose body is `body` in one chunk, ended cleanly.
    pub fn sse(body: Vec<u8>) -> Behaviour {
        Behaviour::Stream {
            steps: vec![Step::Write(body)],
            ending: Ending::Clean,
        }
    }
}

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct Captured {
    pub method: String,
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Captured {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

#[derive(Default)]
struct Shared {
    keep_alive: bool,
    n_connections: AtomicUsize,
    script: Mutex<VecDeque<Behaviour>>,
    captured: Mutex<Vec<Captured>>,
    n_closed_by_client: AtomicUsize,
    closed: Notify,
}

impl Shared {
    fn client_closed(&self) {
        self.n_closed_by_client.fetch_add(1, Ordering::SeqCst);
        self.closed.notify_waiters();
    }
}

/// The running server; dropped, it stops accepting.
pub struct FakeServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    /// Binds 127.0.0.1 on a free port and serves `script`, one behaviour per request; past the end
    /// every request gets HTTP 500 `MOCK_SCRIPT_EXHAUSTED`.
    pub async fn start(script: Vec<Behaviour>) -> FakeServer {
        FakeServer::start_with(script, false).await
    }

    /// As `start`, but a stream that ends cleanly leaves its connection open for another request.
    pub async fn start_keep_alive(script: Vec<Behaviour>) -> FakeServer {
        FakeServer::start_with(script, true).await
    }

    async fn start_with(script: Vec<Behaviour>, keep_alive: bool) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("bound address");
        let shared = Arc::new(Shared {
            keep_alive,
            ..Shared::default()
        });
        *shared.script.lock().expect("fresh lock") = script.into();
        let accept_shared = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                accept_shared.n_connections.fetch_add(1, Ordering::SeqCst);
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let mut sock = sock;
                    while let Some(reusable) = serve(sock, shared.clone()).await {
                        sock = reusable;
                    }
                });
            }
        });
        FakeServer { addr, shared, task }
    }

    /// The base URL a provider should use (an OpenAI-style `/v1` root).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn requests(&self) -> Vec<Captured> {
        self.shared.captured.lock().expect("lock").clone()
    }

    /// Connections accepted so far.
    pub fn n_connections(&self) -> usize {
        self.shared.n_connections.load(Ordering::SeqCst)
    }

    pub fn n_closed_by_client(&self) -> usize {
        self.shared.n_closed_by_client.load(Ordering::SeqCst)
    }

    /// Waits until the server has seen `n` connections closed by the client. A 30 s guard turns a
    /// bug into a failure instead of a hang; it asserts nothing about speed.
    pub async fn wait_closed_by_client(&self, n: usize) {
        let wait = async {
            loop {
                let notified = self.shared.closed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.n_closed_by_client() >= n {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("the client never closed the connection");
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

async fn read_request(sock: &mut TcpStream) -> Option<Captured> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let content_length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < content_length {
        let n = sock.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    body.truncate(content_length);
    Some(Captured {
        method,
        path,
        headers,
        body,
    })
}

/// Resolves when the client closes its side (or the socket fails).
async fn client_gone(rd: &mut OwnedReadHalf) {
    let mut tmp = [0u8; 1024];
    loop {
        match rd.read(&mut tmp).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Serves one request; returns the socket when it stays open for another.
async fn serve(mut sock: TcpStream, shared: Arc<Shared>) -> Option<TcpStream> {
    let _ = sock.set_nodelay(true);
    let request = read_request(&mut sock).await?;
    shared.captured.lock().expect("lock").push(request);
    let behaviour = shared
        .script
        .lock()
        .expect("lock")
        .pop_front()
        .unwrap_or_else(|| {
            Behaviour::status(
                500,
                r#"{"error":{"message":"mock script exhausted","code":"MOCK_SCRIPT_EXHAUSTED"}}"#,
                &[],
            )
        });
    let (mut rd, mut wr) = sock.into_split();
    match behaviour {
        Behaviour::Reply {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\nconnection: close\r\n",
                reason(status),
                body.len()
            );
            if !headers.iter().any(|(k, _)| k == "content-type") {
                head.push_str("content-type: application/json\r\n");
            }
            for (k, v) in &headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = wr.write_all(head.as_bytes()).await;
            let _ = wr.write_all(&body).await;
            let _ = wr.shutdown().await;
        }
        Behaviour::Stream { steps, ending } => {
            let keep = shared.keep_alive && ending == Ending::Clean;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                 transfer-encoding: chunked\r\nconnection: {}\r\n\r\n",
                if keep { "keep-alive" } else { "close" }
            );
            if wr.write_all(head.as_bytes()).await.is_err() {
                shared.client_closed();
                return None;
            }
            for step in steps {
                match step {
                    Step::Write(bytes) => {
                        if bytes.is_empty() {
                            continue;
                        }
                        let mut frame = format!("{:x}\r\n", bytes.len()).into_bytes();
                        frame.extend_from_slice(&bytes);
                        frame.extend_from_slice(b"\r\n");
                        if wr.write_all(&frame).await.is_err() || wr.flush().await.is_err() {
                            shared.client_closed();
                            return None;
                        }
                    }
                    Step::Sleep(d) => {
                        tokio::select! {
                            () = client_gone(&mut rd) => {
                                shared.client_closed();
                                return None;
                            }
                            () = tokio::time::sleep(d) => {}
                        }
                    }
                }
            }
            match ending {
                Ending::Clean => {
                    let _ = wr.write_all(b"0\r\n\r\n").await;
                    if keep {
                        return rd.reunite(wr).ok();
                    }
                    let _ = wr.shutdown().await;
                }
                Ending::Disconnect => {}
                Ending::Stall => {
                    client_gone(&mut rd).await;
                    shared.client_closed();
                }
            }
        }
        Behaviour::StallBeforeHeaders => {
            client_gone(&mut rd).await;
            shared.client_closed();
        }
        Behaviour::DropBeforeHeaders => {}
    }
    None
}
