//! `dsh chat`: a line-oriented conversation with one agent.
//!
//! The answer streams as it arrives: the agent's durable `assistant/chunk` events are rendered as
//! they become durable (`render::Live`). Input is read a line at a time on a plain thread (a blocking
//! read must not hold up the runtime, nor its shutdown): a line typed while the agent is idle is a
//! followup; a line typed while it works is a **steer**, joining the running turn at its next step;
//! `/queue TEXT` is always a followup (its own turn). Ctrl-C while the agent works cancels the turn
//! (pending input discarded; the turn ends `aborted` and the prompt comes back); Ctrl-C at the idle
//! prompt, `/quit` or end of input exits; `/compact` between turns compacts the history (SPEC §15) — end of input first lets running work finish, so
//! `printf 'hi\n' | dsh chat` answers and exits.
//!
//! "Working" is the command's view: set when it sends input, cleared when the agent reports itself
//! idle with everything durable (`status().idle`), which is checked whenever the agent's live status
//! says idle and on every durable event after that, so the prompt returns only after the last event
//! of the turn was shown.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use dsh::MessageId;
use dsh::llm::types::Message;
use dsh::session::event::{CancelCause, EventData};
use dsh::turn::{LiveEvent, Status};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::live::{self, LiveAgent};
use crate::render::{self, Style};
use crate::text::visible;
use crate::{ChatArgs, CliError, Config};
use dsh_actors::{Observation, Observed};

/// Lines read ahead of the conversation at most (typing faster than this just waits).
const LINES_BUFFERED_MAX: usize = 64;

const HELP: &str = concat!(
    "  TEXT          send a message (while the model works: steer the running turn)\n",
    "  /queue TEXT   queue TEXT as its own turn, after the current one\n",
    "  /cancel       cancel the running turn (same as Ctrl-C)\n",
    "  /open GATE    open a gate of the scripted model (--script only)\n",
    "  /compact      summarise older messages into a checkpoint (between turns)\n",
    "  /help         this list\n",
    "  /quit         leave (also Ctrl-D, or Ctrl-C at the prompt)",
);

/// The longest input line taken (a message is at most this large, `Limits::message_bytes_max`);
/// the rest of a longer line is read and discarded, never held.
const LINE_BYTES_MAX: usize = dsh::limits::Limits::DEFAULT.message_bytes_max;

/// Reads stdin line by line on a thread of its own; `None` after end of input. An over-long line or
/// one that is not UTF-8 arrives as an error (shown, not sent).
fn stdin_lines() -> mpsc::Receiver<io::Result<String>> {
    let (tx, rx) = mpsc::channel(LINES_BUFFERED_MAX);
    let spawned = std::thread::Builder::new()
        .name("dsh-stdin".into())
        .spawn(move || {
            let mut input = io::stdin().lock();
            loop {
                let line = match read_line(&mut input, LINE_BYTES_MAX) {
                    Ok(None) => return,
                    Ok(Some(line)) => line,
                    Err(e) => Err(e),
                };
                if tx.blocking_send(line).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        // Without a reader the conversation can only end: report it as an input error.
        let (tx2, rx2) = mpsc::channel(1);
        let _ = tx2.try_send(Err(e));
        return rx2;
    }
    rx
}

/// Reads one line (without its line ending) holding at most `bytes_max` bytes of it. `Ok(None)` at
/// the end of input; `Ok(Some(Err(_)))` for a line over `bytes_max` (the rest is read and dropped)
/// or not UTF-8; `Err` for a failed read.
fn read_line(input: &mut impl BufRead, bytes_max: usize) -> io::Result<Option<io::Result<String>>> {
    let mut line = Vec::new();
    let mut n_bytes = 0usize;
    let mut any = false;
    loop {
        let available = match input.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            if !any {
                return Ok(None);
            }
            break;
        }
        any = true;
        let newline = memchr::memchr(b'\n', available);
        let take = newline.unwrap_or(available.len());
        let room = (bytes_max + 1).saturating_sub(line.len());
        line.extend_from_slice(&available[..take.min(room)]);
        n_bytes = n_bytes.saturating_add(take);
        input.consume(take + usize::from(newline.is_some()));
        if newline.is_some() {
            break;
        }
    }
    // A `\r` before the newline belongs to the line ending (only when the line was kept whole).
    if line.len() == n_bytes && line.last() == Some(&b'\r') {
        line.pop();
        n_bytes -= 1;
    }
    if n_bytes > bytes_max {
        return Ok(Some(Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the line is {n_bytes} bytes, over the limit of {bytes_max}; it was not sent"),
        ))));
    }
    Ok(Some(String::from_utf8(line).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the line is not UTF-8; it was not sent",
        )
    })))
}

/// The terminal side of the conversation.
struct Screen {
    style: Style,
    live: render::Live,
    out: io::Stdout,
}

impl Screen {
    fn prompt(&mut self) {
        let mut out = self.out.lock();
        let _ = self.live.newline(&mut out);
        let _ = write!(out, "{}", self.style.bold("> "));
        let _ = out.flush();
        self.live.mid_line();
    }

    /// Leaves the cursor at the start of a fresh line before the command exits.
    fn finish(&mut self) {
        let mut out = self.out.lock();
        let _ = self.live.newline(&mut out);
        let _ = out.flush();
    }

    fn note(&mut self, text: &str) {
        let mut out = self.out.lock();
        let _ = self.live.newline(&mut out);
        let _ = writeln!(out, "{}", self.style.dim(&visible(text)));
        let _ = out.flush();
    }

    fn event(&mut self, event: &dsh::session::Event) {
        let mut out = self.out.lock();
        let _ = self.live.event(event, &mut out);
        let _ = out.flush();
    }
}

/// What the loop should do after a line.
enum Next {
    /// Nothing was sent to the agent.
    Continue,
    /// Input was sent: the agent works (again).
    Sent,
    Quit,
}

/// Runs `dsh chat`.
///
/// # Errors
/// A `CliError` when the agent cannot start, refuses input for good, or fails.
pub async fn run(args: ChatArgs, config: Config) -> Result<ExitCode, CliError> {
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| CliError::Failed(format!("cannot handle SIGINT: {e}")))?;
    let agent = live::start(&config, &args.agent).await?;
    if agent.minted {
        eprintln!("session: {}", agent.id());
    } else if let Ok(status) = agent.handle.status().await
        && status.last_turn > 0
    {
        eprintln!(
            "resumed session {} after turn {}",
            agent.id(),
            status.last_turn
        );
    }
    let style = Style::detect(std::io::IsTerminal::is_terminal(&io::stdout()));
    let mut screen = Screen {
        style,
        live: render::Live::new(style),
        out: io::stdout(),
    };
    let result = converse(&agent, &mut screen, &mut sigint).await;
    screen.finish();
    let stopped = agent.stop().await;
    result?;
    stopped?;
    Ok(ExitCode::SUCCESS)
}

async fn converse(
    agent: &LiveAgent,
    screen: &mut Screen,
    sigint: &mut tokio::signal::unix::Signal,
) -> Result<(), CliError> {
    let style = screen.style;
    eprintln!(
        "{}",
        style.dim(&format!(
            "dsh chat · {} · {} · /help for commands",
            visible(&agent.provider),
            visible(&agent.model)
        ))
    );
    let mut sub = agent.handle.subscribe();
    let mut lines = stdin_lines();
    let stdin_is_terminal = std::io::IsTerminal::is_terminal(&io::stdin());
    let mut turn = Progress::default();
    let mut eof = false;
    screen.prompt();
    loop {
        tokio::select! {
            line = lines.recv(), if !eof => match line {
                None => {
                    eof = true;
                    if !turn.working {
                        return Ok(());
                    }
                }
                Some(Err(e)) => screen.note(&format!("[cannot read input: {e}]")),
                Some(Ok(line)) => {
                    if stdin_is_terminal {
                        // The terminal echoed the line and its newline.
                        screen.live.at_line_start();
                    }
                    match on_line(agent, screen, &line, turn.working).await? {
                        Next::Quit => return Ok(()),
                        Next::Sent => turn.started(),
                        Next::Continue if turn.working => {}
                        Next::Continue => screen.prompt(),
                    }
                }
            },
            obs = sub.next() => {
                if on_observation(agent, screen, &mut turn, obs).await? {
                    if eof {
                        return Ok(());
                    }
                    screen.prompt();
                }
            },
            _ = sigint.recv() => {
                if turn.working {
                    cancel_turn(agent).await?;
                } else {
                    return Ok(());
                }
            }
        }
    }
}

/// Cancels the running turn for the user (Ctrl-C or `/cancel` while it works).
async fn cancel_turn(agent: &LiveAgent) -> Result<(), CliError> {
    agent
        .handle
        .cancel(CancelCause::User, false)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))
}

/// Shows what the subscription delivered and tracks the turn's progress. Returns whether the work
/// this command sent is now done (idle, with all of its output shown).
async fn on_observation(
    agent: &LiveAgent,
    screen: &mut Screen,
    turn: &mut Progress,
    obs: Option<Observation>,
) -> Result<bool, CliError> {
    let check = match obs {
        None => return Err(CliError::Failed("the agent stopped".into())),
        Some(Observation::Lagged(n)) => {
            screen.note(&format!(
                "[display fell behind: {n} events not shown; `dsh show` has them all]"
            ));
            true
        }
        Some(Observation::Item(Observed::Event { event, .. })) => {
            screen.event(&event);
            turn.last_seq = Some(event.seq);
            turn.reported_idle || matches!(event.data, EventData::TurnEnd(_))
        }
        Some(Observation::Item(Observed::Live {
            event: LiveEvent::Status(s),
            ..
        })) => {
            turn.reported_idle = s == Status::Idle;
            turn.reported_idle
        }
        Some(Observation::Item(Observed::Live { .. })) => false,
        Some(Observation::Item(Observed::Failed { reason, .. })) => {
            return Err(CliError::Failed(format!("the agent failed: {reason}")));
        }
        Some(Observation::Item(Observed::Restarted { .. })) => {
            screen.note("[the agent crashed and was restarted from its log]");
            true
        }
    };
    if turn.working && check && turn.idle_through.is_none() {
        let status = agent
            .handle
            .status()
            .await
            .map_err(|e| CliError::Failed(e.to_string()))?;
        if status.idle {
            turn.idle_through = Some(status.next_seq);
        }
    }
    if turn.is_done() {
        turn.working = false;
        turn.idle_through = None;
        return Ok(true);
    }
    Ok(false)
}

/// Whether the agent is working on what this command sent, and how far its output was shown.
///
/// The agent reports `idle` (live, and in `status()`) as soon as its last event is durable, which
/// can be before this subscriber has rendered that event: the prompt waits until the event just
/// before `status().next_seq` has been shown.
#[derive(Debug, Default)]
struct Progress {
    /// Input was sent and the agent has not yet been seen idle with all of its output shown.
    working: bool,
    /// The last live status said idle.
    reported_idle: bool,
    /// `status()` found the agent idle with this `next_seq`.
    idle_through: Option<u64>,
    /// The highest seq rendered.
    last_seq: Option<u64>,
}

impl Progress {
    /// New input was sent: the agent works, and whatever idleness was seen before is stale.
    fn started(&mut self) {
        self.working = true;
        self.reported_idle = false;
        self.idle_through = None;
    }

    fn is_done(&self) -> bool {
        match (self.working, self.idle_through) {
            (true, Some(next_seq)) => self.last_seq.map_or(next_seq == 0, |s| s + 1 >= next_seq),
            _ => false,
        }
    }
}

async fn on_line(
    agent: &LiveAgent,
    screen: &mut Screen,
    line: &str,
    working: bool,
) -> Result<Next, CliError> {
    let text = line.trim();
    if text.is_empty() {
        return Ok(Next::Continue);
    }
    let (command, rest) = match text.split_once(char::is_whitespace) {
        Some((c, r)) => (c, r.trim()),
        None => (text, ""),
    };
    let refused = |screen: &mut Screen, e: dsh_actors::InputError| {
        screen.note(&format!("[not sent: {e}]"));
    };
    match command {
        "/quit" | "/exit" => return Ok(Next::Quit),
        "/help" => screen.note(HELP),
        "/cancel" => {
            if working {
                cancel_turn(agent).await?;
            } else {
                screen.note("[nothing is running]");
            }
        }
        "/compact" => {
            if working {
                screen.note("[/compact works only between turns]");
            } else {
                match crate::compact::compact(&agent.handle).await {
                    Ok(done) => screen.note(&format!("({})", done.line())),
                    Err(reason) => screen.note(&format!("[not compacted: {reason}]")),
                }
            }
        }
        "/open" => match (&agent.gates, rest) {
            (Some(gates), name) if !name.is_empty() => {
                gates.open(name);
                screen.note(&format!("(gate {name} open)"));
            }
            (Some(_), _) => screen.note("[usage: /open GATE]"),
            (None, _) => screen.note("[/open works only with --script]"),
        },
        "/queue" => {
            if rest.is_empty() {
                screen.note("[usage: /queue TEXT]");
            } else {
                let msg = Message::user_text(MessageId::mint(), rest);
                match agent.handle.followup(msg).await {
                    Ok(()) => {
                        screen.note("(queued as its own turn)");
                        return Ok(Next::Sent);
                    }
                    Err(e) => refused(screen, e),
                }
            }
        }
        c if c.starts_with('/') => {
            screen.note(&format!("[unknown command {c}; /help lists them]"));
        }
        _ => {
            let msg = Message::user_text(MessageId::mint(), text);
            let sent = if working {
                agent.handle.steer(msg).await.map(|()| {
                    screen.note("(steer: joins the running turn at its next step)");
                })
            } else {
                agent.handle.followup(msg).await
            };
            match sent {
                Ok(()) => return Ok(Next::Sent),
                Err(e) => refused(screen, e),
            }
        }
    }
    Ok(Next::Continue)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], bytes_max: usize) -> Vec<Result<String, String>> {
        let mut reader = io::BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        while let Some(line) = read_line(&mut reader, bytes_max).expect("reads") {
            out.push(line.map_err(|e| e.to_string()));
        }
        out
    }

    #[test]
    fn lines_are_bounded_and_the_rest_of_a_long_line_is_dropped() {
        assert_eq!(
            lines(b"one\r\ntwo\n\nlast", 8),
            [
                Ok("one".into()),
                Ok("two".into()),
                Ok(String::new()),
                Ok("last".into())
            ]
        );
        assert_eq!(
            lines(b"123456789\nok\n12345678\n", 8),
            [
                Err("the line is 9 bytes, over the limit of 8; it was not sent".into()),
                Ok("ok".into()),
                Ok("12345678".into())
            ]
        );
        assert_eq!(
            lines(b"\xff\xfe\n", 8),
            [Err("the line is not UTF-8; it was not sent".into())]
        );
        assert!(lines(b"", 8).is_empty());
    }
}
