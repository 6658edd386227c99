//! dsh-mcp against real, independently written MCP servers: `@modelcontextprotocol/server-everything`
//! (npm; stdio and streamable HTTP) and `mcp-server-time` (PyPI). See `support` for how they are
//! found and when a test is skipped.
//!
//! Each test asserts exact results: the tool list and modes, a call with structured arguments, an
//! error result, an image result, a long call cancelled mid-way (with `notifications/cancelled` seen
//! on the wire), a server killed mid-call (the call fails cleanly, the next one restarts it), a
//! call timeout, a server that never answers, 100 agents calling one server at once, and the server
//! dying with its host even on SIGKILL.

mod support;

use std::io::BufRead;
use std::sync::Arc;

use dsh::tools::{ExecutionMode, Tool};
use dsh_mcp::{McpServer, McpServers, McpTool, ServerState};
use serde_json::json;
use support::*;
use tokio_util::sync::CancellationToken;

/// The everything server over stdio, connected; `None` when it is not installed.
async fn everything_stdio(call_timeout_ms: Option<u64>) -> Option<Arc<McpServer>> {
    let (node, index) = everything()?;
    let config = stdio_entry(&node, &[&index, "stdio"], call_timeout_ms)
        .check("every")
        .expect("valid entry");
    let server = McpServer::new(config);
    server
        .connect()
        .await
        .expect("the everything server starts");
    Some(server)
}

fn tool(server: &Arc<McpServer>, name: &str) -> McpTool {
    let info = server
        .status()
        .tools
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("the server has no tool `{name}`"));
    McpTool::new(Arc::clone(server), info)
}

#[tokio::test]
async fn the_everything_server_lists_its_tools_with_schemas_and_modes() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let servers = McpServers::from_servers(vec![Arc::clone(&server)]);
    let registry = servers.tools();
    for name in [
        "every__echo",
        "every__get-sum",
        "every__get-tiny-image",
        "every__trigger-long-running-operation",
        "every__gzip-file-as-resource",
    ] {
        assert!(registry.get(name).is_some(), "{name} in {registry:?}");
    }
    let sum = registry.get("every__get-sum").expect("get-sum");
    let params = sum.parameters();
    assert_eq!(params["type"], "object");
    assert_eq!(params["properties"]["a"]["type"], "number");
    assert_eq!(params["properties"]["b"]["type"], "number");
    // readOnlyHint: true runs in parallel; readOnlyHint: false exclusively.
    assert_eq!(
        registry.execution_mode("every__get-sum", "{}"),
        ExecutionMode::Parallel
    );
    assert_eq!(
        registry.execution_mode("every__gzip-file-as-resource", "{}"),
        ExecutionMode::Exclusive
    );
    let status = server.status();
    assert_eq!(status.state, ServerState::Ready);
    assert!(status.pid.is_some());
    server.stop().await;
    assert_eq!(server.status().state, ServerState::Stopped);
}

#[tokio::test]
async fn the_tool_list_is_read_again_on_request() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let before = server.status().tools;
    let again = server.refresh_tools().await.expect("listed again");
    assert_eq!(again, before);
    assert!(
        !server.tools_changed(),
        "the change flag is cleared by the read"
    );
    server.stop().await;
    assert_eq!(
        server.refresh_tools().await,
        Err("the MCP server `every` was shut down".to_string())
    );
}

#[tokio::test]
async fn a_call_with_structured_arguments_returns_the_servers_text() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let out = tool(&server, "get-sum")
        .execute(
            invocation("every__get-sum", "c1", json!({"a": 2, "b": 3.5})),
            CancellationToken::new(),
        )
        .await;
    assert!(!out.is_error, "{out:?}");
    assert_eq!(text_of(&out), "The sum of 2 and 3.5 is 5.5.");
    server.stop().await;
}

#[tokio::test]
async fn an_is_error_result_is_an_error_result() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let out = tool(&server, "get-sum")
        .execute(
            invocation("every__get-sum", "c1", json!({"a": "two"})),
            CancellationToken::new(),
        )
        .await;
    assert!(out.is_error, "{out:?}");
    assert_eq!(code_of(&out), Some("MCP_TOOL_ERROR"));
    let text = text_of(&out);
    assert!(text.starts_with("Error: "), "{text}");
    assert!(text.contains("Input validation error"), "{text}");
    server.stop().await;
}

#[tokio::test]
async fn an_image_result_is_described_and_kept_in_meta() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let out = tool(&server, "get-tiny-image")
        .execute(
            invocation("every__get-tiny-image", "c1", json!({})),
            CancellationToken::new(),
        )
        .await;
    assert!(!out.is_error, "{out:?}");
    let meta = out.meta.clone().expect("the image is kept in meta");
    let image = &meta["images"][0];
    assert_eq!(image["mediaType"], "image/png");
    let data = image["data"].as_str().expect("base64 data");
    assert!(data.starts_with("iVBORw0KGgo"), "a PNG: {}", &data[..16]);
    assert_eq!(
        text_of(&out),
        format!(
            "Here's the image you requested:\n[image image/png, {} bytes]\nThe image above is the MCP logo.",
            data.len() / 4 * 3
        )
    );
    server.stop().await;
}

// The wire is read by blocking waits: the calls run on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_sends_notifications_cancelled_and_returns_at_once() {
    let Some((node, index)) = everything() else {
        return;
    };
    let wire = Wire::new();
    let server = McpServer::new(
        wire.entry(&node, &index, None)
            .check("every")
            .expect("entry"),
    );
    server.connect().await.expect("starts");
    let long = tool(&server, "trigger-long-running-operation");
    let cancel = CancellationToken::new();
    let call = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            long.execute(
                invocation(
                    "every__trigger-long-running-operation",
                    "c1",
                    json!({"duration": 600, "steps": 600}),
                ),
                cancel,
            )
            .await
        }
    });
    let request = wire.wait_for("\"tools/call\"");
    cancel.cancel();
    let out = call.await.expect("the call task");
    assert_eq!(code_of(&out), Some("ABORTED"));
    assert_eq!(text_of(&out), "Error: tool call aborted");
    let cancelled = wire.wait_for("notifications/cancelled");
    assert_eq!(cancelled["params"]["requestId"], request["id"]);
    // The server still serves other calls.
    let out = tool(&server, "echo")
        .execute(
            invocation("every__echo", "c2", json!({"message": "still here"})),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(text_of(&out), "Echo: still here");
    server.stop().await;
}

// The wire is read by blocking waits: the calls run on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_fails_the_call_and_restarts_at_the_next() {
    let Some((node, index)) = everything() else {
        return;
    };
    let wire = Wire::new();
    let server = McpServer::new(
        wire.entry(&node, &index, None)
            .check("every")
            .expect("entry"),
    );
    server.connect().await.expect("starts");
    let first_pid = server.status().pid.expect("a process");
    let long = tool(&server, "trigger-long-running-operation");
    let call = tokio::spawn(async move {
        long.execute(
            invocation(
                "every__trigger-long-running-operation",
                "c1",
                json!({"duration": 600, "steps": 600}),
            ),
            CancellationToken::new(),
        )
        .await
    });
    wire.wait_for("\"tools/call\"");
    kill_tree(first_pid);
    let out = call.await.expect("the call task");
    assert_eq!(code_of(&out), Some("MCP_SERVER_EXITED"), "{out:?}");
    assert_eq!(
        text_of(&out),
        "Error: the MCP server `every` exited or closed the connection during the call; it is restarted at the next call"
    );
    let out = tool(&server, "get-sum")
        .execute(
            invocation("every__get-sum", "c2", json!({"a": 1, "b": 1})),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(text_of(&out), "The sum of 1 and 1 is 2.");
    let second_pid = server.status().pid.expect("a new process");
    assert_ne!(first_pid, second_pid);
    server.stop().await;
}

#[tokio::test]
async fn a_call_past_its_timeout_is_an_error_result() {
    let Some(server) = everything_stdio(Some(300)).await else {
        return;
    };
    let out = tool(&server, "trigger-long-running-operation")
        .execute(
            invocation(
                "every__trigger-long-running-operation",
                "c1",
                json!({"duration": 600, "steps": 600}),
            ),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(code_of(&out), Some("TIMEOUT"));
    assert_eq!(
        text_of(&out),
        "Error: the MCP server `every` did not answer `trigger-long-running-operation` within 300 ms"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_server_that_never_answers_fails_its_calls_within_the_startup_timeout() {
    let mut entry = stdio_entry("sleep", &["600"], None);
    entry.startup_timeout_ms = Some(200);
    let server = McpServer::new(entry.check("mute").expect("entry"));
    let err = server.connect().await.expect_err("no handshake");
    assert_eq!(
        err,
        "the MCP server `mute`: no answer within the startup timeout of 200 ms"
    );
    assert_eq!(
        server.status().state,
        ServerState::Down {
            error: "no answer within the startup timeout of 200 ms".into()
        }
    );
    // Right after a failed start the backoff answers at once, without starting another process.
    let out = server
        .call("anything", None, &CancellationToken::new())
        .await;
    assert_eq!(code_of(&out), Some("MCP_UNAVAILABLE"));
    assert!(
        text_of(&out).starts_with(
            "Error: the MCP server `mute` is down (no answer within the startup timeout of 200 ms); the next attempt to start it is in "
        ),
        "{}",
        text_of(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_agents_call_one_server_at_once() {
    let Some(server) = everything_stdio(None).await else {
        return;
    };
    let pid = server.status().pid;
    let sum = Arc::new(tool(&server, "get-sum"));
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let sum = Arc::clone(&sum);
            tokio::spawn(async move {
                let out = sum
                    .execute(
                        invocation("every__get-sum", &format!("c{i}"), json!({"a": i, "b": 1})),
                        CancellationToken::new(),
                    )
                    .await;
                (i, text_of(&out))
            })
        })
        .collect();
    for call in calls {
        let (i, text) = call.await.expect("a call task");
        assert_eq!(text, format!("The sum of {i} and 1 is {}.", i + 1));
    }
    assert_eq!(server.status().pid, pid, "one process served every call");
    server.stop().await;
}

#[tokio::test]
async fn the_everything_server_over_streamable_http() {
    let Some((node, index)) = everything() else {
        return;
    };
    let port = free_port();
    let mut child = tokio::process::Command::new(&node)
        .args([&index, "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the HTTP server");
    let stderr = child.stderr.take().expect("stderr");
    // Wait for the server to say it listens (reading its stderr on a thread).
    let stderr = stderr.into_owned_fd().expect("fd");
    tokio::task::spawn_blocking(move || {
        let reader = std::io::BufReader::new(std::fs::File::from(stderr));
        for line in reader.lines() {
            let line = line.expect("stderr line");
            if line.contains("listening on port") {
                return;
            }
        }
        panic!("the HTTP server ended before listening");
    })
    .await
    .expect("the stderr reader");
    let config =
        dsh_mcp::ServerConfig::http("web", &format!("http://127.0.0.1:{port}/mcp")).expect("entry");
    let servers = McpServers::start(vec![config]).await;
    let registry = servers.tools();
    let sum = registry.get("web__get-sum").expect("get-sum over HTTP");
    let out = sum
        .execute(
            invocation("web__get-sum", "c1", json!({"a": 40, "b": 2})),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(text_of(&out), "The sum of 40 and 2 is 42.");
    servers.shutdown().await;
    let _ = child.kill().await;
}

#[tokio::test]
async fn the_python_time_server_converts_and_reports_errors() {
    let Some(program) = time_server() else {
        return;
    };
    let config = stdio_entry(&program, &["--local-timezone", "UTC"], None)
        .check("time")
        .expect("entry");
    let servers = McpServers::start(vec![config]).await;
    let registry = servers.tools();
    assert_eq!(
        format!("{registry:?}"),
        "[\"time__convert_time\", \"time__get_current_time\"]"
    );
    let convert = registry.get("time__convert_time").expect("convert_time");
    let out = convert
        .execute(
            invocation(
                "time__convert_time",
                "c1",
                json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
            ),
            CancellationToken::new(),
        )
        .await;
    assert!(!out.is_error, "{out:?}");
    let answer: serde_json::Value = serde_json::from_str(&text_of(&out)).expect("JSON text");
    assert_eq!(answer["target"]["timezone"], "Asia/Tokyo");
    assert!(
        answer["target"]["datetime"]
            .as_str()
            .is_some_and(|t| t.contains("T21:00:00")),
        "{answer}"
    );
    let out = registry
        .get("time__get_current_time")
        .expect("get_current_time")
        .execute(
            invocation(
                "time__get_current_time",
                "c2",
                json!({"timezone": "Not/AZone"}),
            ),
            CancellationToken::new(),
        )
        .await;
    assert!(out.is_error, "{out:?}");
    assert_eq!(code_of(&out), Some("MCP_TOOL_ERROR"));
    assert!(text_of(&out).contains("Not/AZone"), "{}", text_of(&out));
    servers.shutdown().await;
}

/// The server dies with its host even when the host is killed with SIGKILL: the test runs this
/// binary again as the host (`death_helper`), reads the server's pid, kills the host and waits for
/// the server to be gone.
#[test]
fn a_server_dies_with_its_host_even_on_sigkill() {
    if everything().is_none() {
        return;
    }
    let mut host = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "death_helper", "--nocapture", "--test-threads=1"])
        .env("DSH_MCP_DEATH_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the host");
    let stdout = host.stdout.take().expect("stdout");
    let mut server_pid = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        // The harness prints `test death_helper ... ` before the helper's own output.
        if let Some((_, pid)) = line.split_once("server pid ") {
            server_pid = Some(pid.trim().parse::<u32>().expect("a pid"));
            break;
        }
    }
    let server_pid = server_pid.expect("the host printed the server's pid");
    host.kill().expect("SIGKILL the host");
    let _ = host.wait();
    wait_exit(server_pid);
}

/// The host process of `a_server_dies_with_its_host_even_on_sigkill`: starts the server, prints its
/// pid and waits to be killed. Without `DSH_MCP_DEATH_HELPER` it does nothing.
#[tokio::test]
async fn death_helper() {
    if std::env::var_os("DSH_MCP_DEATH_HELPER").is_none() {
        return;
    }
    let Some((node, index)) = everything() else {
        return;
    };
    // A server that outlives the end of its input (the everything server alone exits when its
    // stdin closes, which would hide a missing parent-death signal): `sh` runs it, then `sleep`s
    // in its place under the same pid.
    let entry = stdio_entry(
        "sh",
        &["-c", "\"$0\" \"$1\" stdio; exec sleep 600", &node, &index],
        None,
    );
    let server = McpServer::new(entry.check("every").expect("entry"));
    server.connect().await.expect("starts");
    let pid = server.status().pid.expect("a process");
    println!("server pid {pid}");
    std::future::pending::<()>().await;
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// dsh's API keys never reach a server's environment unless its entry names them: the test runs
/// this binary again (`env_helper`) with both keys set, and reads what the everything server's
/// `get-env` tool sees.
#[test]
fn a_server_gets_dshs_api_keys_only_when_its_entry_names_them() {
    if everything().is_none() {
        return;
    }
    let seen = |mode: &str| -> String {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "env_helper", "--nocapture", "--test-threads=1"])
            .env("DSH_MCP_ENV_HELPER", mode)
            .env("DEEPSEEK_API_KEY", "sk-deepseek-secret")
            .env("OPENAI_API_KEY", "sk-openai-secret")
            .output()
            .expect("run the helper");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let (_, env) = stdout
            .split_once("server env: ")
            .unwrap_or_else(|| panic!("the helper printed the server's environment: {stdout}"));
        env.lines().next().unwrap_or("").to_string()
    };
    let inherited = seen("inherit");
    assert!(inherited.contains("\"PATH\""), "{inherited}");
    assert!(!inherited.contains("sk-deepseek-secret"), "{inherited}");
    assert!(!inherited.contains("sk-openai-secret"), "{inherited}");
    let named = seen("named");
    assert!(
        named.contains("\"OPENAI_API_KEY\":\"sk-for-the-server\""),
        "{named}"
    );
    assert!(!named.contains("sk-deepseek-secret"), "{named}");
}

/// The host process of `a_server_gets_dshs_api_keys_only_when_its_entry_names_them`. Without
/// `DSH_MCP_ENV_HELPER` it does nothing.
#[tokio::test]
async fn env_helper() {
    let Some(mode) = std::env::var_os("DSH_MCP_ENV_HELPER") else {
        return;
    };
    let Some((node, index)) = everything() else {
        return;
    };
    let mut entry = stdio_entry(&node, &[&index, "stdio"], None);
    if mode == "named" {
        entry.env = Some(
            [(
                "OPENAI_API_KEY".to_string(),
                "sk-for-the-server".to_string(),
            )]
            .into(),
        );
    }
    let server = McpServer::new(entry.check("every").expect("entry"));
    server.connect().await.expect("starts");
    let out = tool(&server, "get-env")
        .execute(
            invocation("every__get-env", "c1", json!({})),
            CancellationToken::new(),
        )
        .await;
    let env: serde_json::Value = serde_json::from_str(&text_of(&out)).expect("JSON text");
    println!("server env: {env}");
    server.stop().await;
}
