//! MCP tools through the command line and the scenario runner, against the real everything server
//! (`@modelcontextprotocol/server-everything`, installed by `mcp/tests/install-servers.sh` into
//! `<project>/.mcp-servers/`, or `DSH_MCP_SERVERS_DIR`). Without Node.js or the package a test
//! prints that it was skipped; with `CI=true` it fails instead.
//!
//! Covered: a scripted model calling MCP tools (the exact `tool/call` / `tool/result` sequence in
//! the log), `dsh run` offering MCP tools, `dsh mcp list` (text and JSON), and a bad entry in
//! `dsh.toml` as one error line naming the key; a tool list the server changes mid-turn (a fixture
//! server), and a `dsh` killed with SIGKILL taking its servers' whole process groups with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dsh::scenario::{Scenario, event_json};
use serde_json::{Value, json};

/// `node` and the everything server's entry point; `None` (skipped) or a panic under `CI=true`.
fn everything() -> Option<(String, String)> {
    let dir = match std::env::var_os("DSH_MCP_SERVERS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.mcp-servers"),
    };
    let index = dir.join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let node = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("node"))
            .find(|p| p.is_file())
    });
    match (node, index.is_file()) {
        (Some(node), true) => Some((
            node.to_string_lossy().into_owned(),
            index.to_string_lossy().into_owned(),
        )),
        _ => {
            let message = format!(
                "Node.js or @modelcontextprotocol/server-everything is missing ({}); run mcp/tests/install-servers.sh",
                index.display()
            );
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{message}");
            }
            eprintln!("skipped: {message}");
            None
        }
    }
}

fn dsh(dir: &Path, args: &[&str]) -> Output {
    let bin = std::env::var_os("DSH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_dsh")));
    Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env_remove("DSH_CONFIG")
        .env_remove("DSH_DATA_DIR")
        .env_remove("DSH_PROVIDER")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run dsh")
}

fn config_with_everything(dir: &Path, node: &str, index: &str) {
    let toml = format!(
        "[mcp_servers.every]\ncommand = {}\nargs = [{}, \"stdio\"]\n",
        json!(node),
        json!(index)
    );
    std::fs::write(dir.join("dsh.toml"), toml).expect("write dsh.toml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_model_calls_mcp_tools_and_the_log_has_the_exact_tool_sequence() {
    let Some((node, index)) = everything() else {
        return;
    };
    let scenario = Scenario::from_value(&json!({
        "name": "a scripted model calls MCP tools",
        "mcp_servers": {"every": {"command": node, "args": [index, "stdio"]}},
        "model": [
            {"tool_calls": [
                {"id": "c1", "name": "every__get-sum", "arguments": "{\"a\":2,\"b\":3}"},
                {"id": "c2", "name": "every__echo", "arguments": "{\"message\":\"hi\"}"}
            ]},
            {"text": "done"}
        ],
        "actions": [{"followup": "add", "id": "m1"}, {"wait_idle": true}]
    }))
    .expect("a valid scenario");
    let log = dsh_cli::scenario::run_scenario(&scenario)
        .await
        .expect("the scenario runs");
    let tools: Vec<Value> = log
        .iter()
        .map(event_json)
        .filter(|e| e["type"] == "tool/call" || e["type"] == "tool/result")
        .map(|e| {
            let mut data = e["data"].clone();
            // The runtime mints the result message's id: the one part that differs between runs.
            if let Some(message) = data.get_mut("message").and_then(Value::as_object_mut) {
                message.remove("id");
            }
            json!({"type": e["type"], "data": data})
        })
        .collect();
    let result = |id: &str, text: &str| {
        json!({"type": "tool/result", "data": {"turn": 1, "step": 1, "message": {
            "role": "user",
            "content": [{"type": "tool-result", "toolCallId": id,
                         "content": [{"type": "text", "text": text}], "isError": false}],
            "source": {"kind": "tool", "callId": id}}}})
    };
    assert_eq!(
        tools,
        vec![
            json!({"type": "tool/call", "data": {"turn": 1, "step": 1, "callId": "c1",
                   "name": "every__get-sum", "arguments": "{\"a\":2,\"b\":3}"}}),
            json!({"type": "tool/call", "data": {"turn": 1, "step": 1, "callId": "c2",
                   "name": "every__echo", "arguments": "{\"message\":\"hi\"}"}}),
            result("c1", "The sum of 2 and 3 is 5."),
            result("c2", "Echo: hi"),
        ]
    );
    let last = log.last().map(event_json).expect("a log");
    assert_eq!(last["type"], "turn/end");
    assert_eq!(last["data"]["reason"], json!({"kind": "completed"}));
}

#[test]
fn a_scenario_whose_mcp_server_does_not_start_fails_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("s.json");
    std::fs::write(
        &file,
        json!({
            "name": "broken server",
            "mcp_servers": {"gone": {"command": "/nonexistent/server"}},
            "model": [{"text": "ok"}],
            "actions": [{"followup": "hi"}, {"wait_idle": true}]
        })
        .to_string(),
    )
    .expect("write");
    let out = dsh(tmp.path(), &["scenario", "run", "s.json"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "the MCP server `gone` did not start: cannot start `/nonexistent/server`: No such file or directory (os error 2)"
        ),
        "{stderr}"
    );
}

#[test]
fn dsh_run_offers_mcp_tools_to_the_model() {
    let Some((node, index)) = everything() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    config_with_everything(tmp.path(), &node, &index);
    let script = json!([
        {"tool_calls": [{"id": "c1", "name": "every__get-sum", "arguments": "{\"a\":40,\"b\":2}"}]},
        {"text": "the answer is 42"}
    ]);
    std::fs::write(tmp.path().join("script.json"), script.to_string()).expect("write");
    let out = dsh(
        tmp.path(),
        &["run", "--script", "script.json", "--session", "s1", "add"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "the answer is 42\n");
    let raw = dsh(tmp.path(), &["show", "--raw", "s1"]);
    let results: Vec<Value> = String::from_utf8_lossy(&raw.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "tool/result")
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(
        results[0]["data"]["message"]["content"][0]["content"],
        json!([{"type": "text", "text": "The sum of 40 and 2 is 42."}])
    );
}

#[test]
fn dsh_mcp_list_prints_each_server_its_state_and_its_tools() {
    let Some((node, index)) = everything() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let toml = format!(
        "[mcp_servers.every]\ncommand = {}\nargs = [{}, \"stdio\"]\n[mcp_servers.gone]\ncommand = \"/nonexistent/server\"\n",
        json!(node),
        json!(index)
    );
    std::fs::write(tmp.path().join("dsh.toml"), toml).expect("write");
    let out = dsh(tmp.path(), &["mcp", "list"]);
    assert_eq!(out.status.code(), Some(1), "one server is down");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("every (stdio): ready, "), "{text}");
    assert!(
        lines.contains(&"  every__get-sum  read-only  Returns the sum of two numbers"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  every__gzip-file-as-resource  exclusive  ")),
        "{text}"
    );
    assert_eq!(
        lines.last().copied(),
        Some(
            "gone (stdio): down: cannot start `/nonexistent/server`: No such file or directory (os error 2)"
        )
    );
    let out = dsh(tmp.path(), &["mcp", "list", "--json"]);
    let all: Value = serde_json::from_slice(&out.stdout).expect("one JSON array");
    assert_eq!(all[0]["name"], "every");
    assert_eq!(all[0]["state"], "ready");
    assert!(
        all[0]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .any(|t| t["name"] == "every__get-sum" && t["read_only"] == true)
    );
    assert_eq!(all[1]["state"], "down");
}

#[test]
fn a_bad_mcp_server_entry_is_one_error_line_naming_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        tmp.path().join("dsh.toml"),
        "[mcp_servers.every]\ncommand = 1\n",
    )
    .expect("write");
    let out = dsh(tmp.path(), &["mcp", "list"]);
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "dsh: config dsh.toml: key `mcp_servers.every.command`: invalid type: integer `1`, expected a string\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn dsh_mcp_list_without_servers_says_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = dsh(tmp.path(), &["mcp", "list"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no MCP servers configured (add [mcp_servers.NAME] to dsh.toml)\n"
    );
    let out = dsh(tmp.path(), &["mcp", "list", "--json"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n");
}

/// Kills `pid` and its children with SIGKILL.
fn kill_tree(pid: u32) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace() {
        if let Ok(child) = child.parse() {
            kill_tree(child);
        }
    }
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_ends_the_call_with_an_error_and_the_next_step_restarts_it() {
    use std::io::BufRead;
    let Some((node, index)) = everything() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let fifo = tmp.path().join("wire");
    let pidfile = tmp.path().join("pid");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success()
    );
    // The first server runs behind `tee` into the FIFO, so the test sees the call arrive, and `sh`
    // notes its pid so the test can kill it; the restarted one (the pid file exists) runs plainly.
    let script = "if [ -e \"$3\" ]; then exec \"$1\" \"$2\" stdio; fi; echo $$ > \"$3\"; tee \"$0\" | \"$1\" \"$2\" stdio";
    let args = json!([
        "-c",
        script,
        fifo.to_string_lossy(),
        node,
        index,
        pidfile.to_string_lossy()
    ]);
    let scenario = Scenario::from_value(&json!({
        "name": "an MCP server killed mid-call",
        "mcp_servers": {"every": {"command": "sh", "args": args}},
        "model": [
            {"tool_calls": [{"id": "c1", "name": "every__trigger-long-running-operation",
                             "arguments": "{\"duration\":600,\"steps\":600}"}]},
            {"tool_calls": [{"id": "c2", "name": "every__get-sum", "arguments": "{\"a\":1,\"b\":1}"}]},
            {"text": "done"}
        ],
        "actions": [{"followup": "go", "id": "m1"}, {"wait_idle": true}]
    }))
    .expect("a valid scenario");
    let killer = std::thread::spawn(move || {
        let file = std::fs::File::open(&fifo).expect("open the wire");
        for line in std::io::BufReader::new(file).lines() {
            if line.expect("a wire line").contains("\"tools/call\"") {
                break;
            }
        }
        let pid = std::fs::read_to_string(&pidfile).expect("the server's pid");
        kill_tree(pid.trim().parse().expect("a pid"));
    });
    let log = dsh_cli::scenario::run_scenario(&scenario)
        .await
        .expect("the scenario runs");
    killer.join().expect("the killer thread");
    let results: Vec<Value> = log
        .iter()
        .map(event_json)
        .filter(|e| e["type"] == "tool/result")
        .map(|e| {
            json!({"step": e["data"]["step"], "error": e["data"]["error"],
                        "content": e["data"]["message"]["content"][0]})
        })
        .collect();
    assert_eq!(
        results,
        vec![
            json!({"step": 1, "error": {"name": "McpError", "code": "MCP_SERVER_EXITED"},
                   "content": {"type": "tool-result", "toolCallId": "c1", "isError": true,
                               "content": [{"type": "text", "text": "Error: the MCP server `every` exited or closed the connection during the call; it is restarted at the next call"}]}}),
            json!({"step": 2, "error": null,
                   "content": {"type": "tool-result", "toolCallId": "c2", "isError": false,
                               "content": [{"type": "text", "text": "The sum of 1 and 1 is 2."}]}}),
        ]
    );
    let last = log.last().map(event_json).expect("a log");
    assert_eq!(last["type"], "turn/end");
    assert_eq!(last["data"]["reason"], json!({"kind": "completed"}));
}

/// `python3` and the fixture server whose tool list changes (`mcp/tests/support/changing_tools.py`).
fn changing_tools_server() -> Option<(String, String)> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/support/changing_tools.py");
    let python = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
    });
    match python {
        Some(python) => Some((
            python.to_string_lossy().into_owned(),
            script.to_string_lossy().into_owned(),
        )),
        None => {
            let message = "python3 is not on PATH (needed by the changing-tools MCP fixture)";
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("{message}");
            }
            eprintln!("skipped: {message}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_the_server_adds_mid_turn_is_offered_from_the_next_step_with_a_changed_header() {
    let Some((python, script)) = changing_tools_server() else {
        return;
    };
    let scenario = Scenario::from_value(&json!({
        "name": "an MCP server changes its tool list mid-turn",
        "mcp_servers": {"chg": {"command": python, "args": [script]}},
        "model": [
            {"tool_calls": [{"id": "c1", "name": "chg__add_tool", "arguments": "{\"name\":\"greet\"}"}]},
            {"tool_calls": [{"id": "c2", "name": "chg__greet", "arguments": "{\"text\":\"hi\"}"}]},
            {"tool_calls": [{"id": "c3", "name": "chg__remove_tool", "arguments": "{\"name\":\"greet\"}"}]},
            {"text": "done"}
        ],
        "actions": [{"followup": "go", "id": "m1"}, {"wait_idle": true}]
    }))
    .expect("a valid scenario");
    let log = dsh_cli::scenario::run_scenario(&scenario)
        .await
        .expect("the scenario runs");
    let seen: Vec<Value> = log
        .iter()
        .map(event_json)
        .filter_map(|e| {
            let d = &e["data"];
            match e["type"].as_str()? {
                "step/start" => Some(json!(["step", d["step"]])),
                "request/header" => {
                    let names: Vec<&str> = d["header"]["tools"]
                        .as_array()?
                        .iter()
                        .filter_map(|t| t["name"].as_str())
                        .collect();
                    Some(json!(["header", d["reason"], names]))
                }
                "tool/call" => Some(json!(["call", d["name"]])),
                "tool/result" => {
                    let block = &d["message"]["content"][0];
                    Some(json!([
                        "result",
                        block["content"][0]["text"],
                        block["isError"]
                    ]))
                }
                _ => None,
            }
        })
        .collect();
    let before = json!(["chg__add_tool", "chg__remove_tool"]);
    let with_greet = json!(["chg__add_tool", "chg__greet", "chg__remove_tool"]);
    assert_eq!(
        seen,
        vec![
            json!(["step", 1]),
            json!(["header", "initial", before]),
            json!(["call", "chg__add_tool"]),
            json!(["result", "added greet", false]),
            json!(["step", 2]),
            json!(["header", "change", with_greet]),
            json!(["call", "chg__greet"]),
            json!(["result", "greet says hi", false]),
            json!(["step", 3]),
            json!(["call", "chg__remove_tool"]),
            json!(["result", "removed greet", false]),
            json!(["step", 4]),
            json!(["header", "change", before]),
        ]
    );
    let last = log.last().map(event_json).expect("a log");
    assert_eq!(last["data"]["reason"], json!({"kind": "completed"}));
}

/// Whether `pid` still runs (a zombie waiting for a reaper counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[test]
fn a_dsh_killed_with_sigkill_takes_its_servers_and_what_they_started_with_it() {
    let Some((node, index)) = everything() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let pids = tmp.path().join("pids");
    // The server starts a child of its own first (as `npx` starts `node`): a `sleep` that neither
    // reads its input nor gets the parent-death signal, so only the process group's watcher can
    // end it. `$$` is the server's pid after `exec`.
    let toml = format!(
        "[mcp_servers.every]\ncommand = \"sh\"\nargs = [\"-c\", {}, {}, {}, {}]\n",
        json!("sleep 600 & echo $$ $! > \"$2\"; exec \"$0\" \"$1\" stdio"),
        json!(node),
        json!(index),
        json!(pids.to_string_lossy())
    );
    std::fs::write(tmp.path().join("dsh.toml"), toml).expect("write dsh.toml");
    let bin = std::env::var_os("DSH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_dsh")));
    let mut chat = Command::new(bin)
        .args(["chat", "--provider", "sim", "--session", "s1"])
        .current_dir(tmp.path())
        .env_remove("DSH_CONFIG")
        .env_remove("DSH_DATA_DIR")
        .env_remove("DSH_PROVIDER")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start dsh chat");
    // The bounds below are hang guards, not timing assertions.
    let started = std::time::Instant::now();
    let written = loop {
        if let Ok(text) = std::fs::read_to_string(&pids)
            && text.ends_with('\n')
        {
            break text;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the server never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let pids: Vec<u32> = written
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 2, "{written}");
    assert!(pids.iter().all(|&p| alive(p)), "both run before the kill");
    chat.kill().expect("SIGKILL dsh");
    let _ = chat.wait();
    let killed = std::time::Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            killed.elapsed() < std::time::Duration::from_secs(60),
            "still running after dsh was killed: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// An image result reaches the model as a text line (the data kept in the result's `meta`), so the
/// OpenAI-compatible request built from the session afterwards is valid: an image block inside a
/// tool result would be `UNSUPPORTED_CONTENT` on that text path, failing every later request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_result_leaves_the_session_sendable_to_an_openai_compatible_endpoint() {
    let Some((node, index)) = everything() else {
        return;
    };
    let scenario = Scenario::from_value(&json!({
        "name": "an MCP image result",
        "mcp_servers": {"every": {"command": node, "args": [index, "stdio"]}},
        "model": [
            {"tool_calls": [{"id": "c1", "name": "every__get-tiny-image", "arguments": "{}"}]},
            {"text": "a logo"}
        ],
        "actions": [{"followup": "show me", "id": "m1"}, {"wait_idle": true}]
    }))
    .expect("a valid scenario");
    let log = dsh_cli::scenario::run_scenario(&scenario)
        .await
        .expect("the scenario runs");
    let result = log
        .iter()
        .map(event_json)
        .find(|e| e["type"] == "tool/result")
        .expect("a tool result");
    let block = &result["data"]["message"]["content"][0];
    assert_eq!(block["isError"], false);
    let content = block["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{content:?}");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().expect("text");
    assert!(text.contains("[image image/png, "), "{text}");
    let session =
        dsh::session::Session::from_events(dsh::SessionId::new("img").expect("id"), log.clone())
            .expect("the log folds");
    let request = dsh::llm::types::LlmRequest {
        config: dsh::llm::types::LlmCallConfig {
            provider: "openai".into(),
            model: "deepseek-chat".into(),
            ..Default::default()
        },
        system: None,
        tools: Vec::new(),
        messages: session.history(),
        session_id: None,
        purpose: None,
    };
    let body = dsh::llm::openai::serialize_request(&Default::default(), &request)
        .expect("the request after an image result is valid on the text path");
    let body: Value = serde_json::from_slice(&body).expect("JSON");
    let tool_message = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool message");
    assert_eq!(tool_message["tool_call_id"], "c1");
    assert!(
        tool_message["content"]
            .as_str()
            .is_some_and(|c| c.contains("[image image/png, ")),
        "{tool_message}"
    );
}
