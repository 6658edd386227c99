//! Support for the store tests and benches: realistic turns built through `Session::append` (so every
//! event is valid), and small helpers to compare logs.
//!
//! A turn is cut into the batches the runtime makes durable at its checkpoints (SPEC §6): the
//! followup's inbox splice (input acknowledged), the claim up to the user message (before the model
//! request), the streamed chunks with the assistant message and its `tool/call` (before the tool
//! body), the tool result with the step boundary (before the second request), and the final answer
//! with `step/end` and `turn/end`.

#![allow(dead_code)] // each test binary uses part of this

use std::sync::Arc;

use dsh::ids::{MessageId, SessionId};
use dsh::llm::types::{
    BlockType, ContentBlock, FinishReason, Message, MessageSource, Role, StreamChunk, TokenUsage,
};
use dsh::session::event::{
    AssistantChunk, AssistantMessageEvent, InboxSpliced, InboxTarget, StepRef, ToolCallEvent,
    ToolResultEvent, TurnEnd, TurnEndReason, TurnStart,
};
use dsh::session::store::EncodedEvent;
use dsh::session::{Event, EventData, EventDraft, Session};

/// Writes realistic turns into an in-memory `Session`, handing out the batches to store.
pub struct TurnWriter {
    session: Session,
    time_ms: i64,
    /// Bytes of text in each text delta and message (sets the event size).
    text_bytes: usize,
}

impl TurnWriter {
    pub fn new(id: SessionId, text_bytes: usize) -> TurnWriter {
        TurnWriter {
            session: Session::new(id),
            time_ms: 1_700_000_000_000,
            text_bytes,
        }
    }

    /// Continues a log read back from a store (repair closers included).
    pub fn resume(id: SessionId, events: Vec<Event>, text_bytes: usize) -> TurnWriter {
        let time_ms = events.last().map_or(1_700_000_000_000, |e| e.time);
        let session = Session::from_events(id, events).expect("a loaded log is valid");
        TurnWriter {
            session,
            time_ms,
            text_bytes,
        }
    }

    pub fn id(&self) -> &SessionId {
        self.session.id()
    }

    pub fn next_seq(&self) -> u64 {
        self.session.next_seq()
    }

    pub fn events(&self) -> &[Event] {
        self.session.events()
    }

    fn push(&mut self, draft: EventDraft) -> Event {
        self.time_ms += 1;
        self.session
            .append(draft, self.time_ms)
            .expect("the turn writer builds valid events")
            .clone()
    }

    fn text(&self, turn: u64, what: &str) -> String {
        let mut text = format!("{what} of turn {turn}: ");
        let filler = "the quick brown fox jumps over the lazy dog; ";
        while text.len() < self.text_bytes {
            text.push_str(filler);
        }
        text.truncate(self.text_bytes.max(1));
        text
    }

    fn chunk(&mut self, turn: u64, step: u64, chunk: StreamChunk) -> Event {
        self.push(EventDraft::log(EventData::AssistantChunk(
            std::sync::Arc::new(AssistantChunk { turn, step, chunk }),
        )))
    }

    /// The chunks of a text block at index 0 streamed as `deltas`: its start, one delta each, and
    /// its end carrying the whole text.
    fn text_block(&mut self, turn: u64, step: u64, deltas: &[&str]) -> Vec<Event> {
        let mut chunks = vec![self.chunk(
            turn,
            step,
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            },
        )];
        for delta in deltas {
            chunks.push(self.chunk(
                turn,
                step,
                StreamChunk::TextDelta {
                    index: 0,
                    text: (*delta).to_string(),
                },
            ));
        }
        chunks.push(self.chunk(
            turn,
            step,
            StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::text(deltas.concat()),
            },
        ));
        chunks
    }

    /// The batches of one whole turn with one tool call (two steps), in checkpoint order.
    pub fn turn_batches(&mut self) -> Vec<Vec<Event>> {
        let turn = self.session.last_turn() + 1;
        let call_id = format!("call-{turn}");
        let user = Arc::new(Message::user_text(
            MessageId::new(&format!("u-{turn}")).expect("valid id"),
            self.text(turn, "question"),
        ));
        let mut batches = Vec::new();

        // Followup: durable before the input call returns.
        batches.push(vec![self.push(EventDraft::log(EventData::InboxSpliced(
            InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: None,
                inserted: vec![Arc::clone(&user)],
                outcome: None,
            },
        )))]);

        // Claim and step 1: durable before the model request.
        batches.push(vec![
            self.push(EventDraft::log(EventData::TurnStart(TurnStart { turn }))),
            self.push(EventDraft::log(EventData::InboxSpliced(InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: Some(1),
                inserted: Vec::new(),
                outcome: None,
            }))),
            self.push(EventDraft::log(EventData::StepStart(StepRef {
                turn,
                step: 1,
            }))),
            self.push(EventDraft::append(EventData::UserMessage(user), None)),
        ]);

        // The stream, the assistant message and the tool call: durable before the tool body runs.
        let text = self.text(turn, "thinking");
        let (head, tail) = text.split_at(text.len() / 2);
        let arguments = format!("{{\"path\":\"src/file-{turn}.rs\"}}");
        let mut batch = self.text_block(turn, 1, &[head, tail]);
        batch.extend([
            self.chunk(
                turn,
                1,
                StreamChunk::BlockStart {
                    index: 1,
                    block_type: BlockType::ToolCall,
                },
            ),
            self.chunk(
                turn,
                1,
                StreamChunk::ToolCallDelta {
                    index: 1,
                    id: call_id.clone(),
                    name: Some("read".to_string()),
                    arguments_delta: arguments.clone(),
                },
            ),
            self.chunk(
                turn,
                1,
                StreamChunk::BlockEnd {
                    index: 1,
                    block: ContentBlock::ToolCall {
                        id: call_id.clone(),
                        name: "read".to_string(),
                        arguments: arguments.clone(),
                    },
                },
            ),
            self.chunk(turn, 1, StreamChunk::Usage { usage: usage() }),
            self.chunk(turn, 1, StreamChunk::finish(FinishReason::ToolCalls)),
        ]);
        let chunk_seqs: Vec<u64> = batch.iter().map(|e| e.seq).collect();
        let assistant = Message {
            id: MessageId::new(&format!("a-{turn}-1")).expect("valid id"),
            role: Role::Assistant,
            content: vec![
                ContentBlock::text(&text),
                ContentBlock::ToolCall {
                    id: call_id.clone(),
                    name: "read".to_string(),
                    arguments: arguments.clone(),
                },
            ],
            source: MessageSource::model("sim", "sim-1"),
        };
        batch.push(self.push(EventDraft::append(
            EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                turn,
                step: 1,
                message: Arc::new(assistant),
                usage: Some(usage()),
                interrupted: None,
            })),
            Some(chunk_seqs),
        )));
        let call = self.push(EventDraft::log(EventData::ToolCall(Box::new(
            ToolCallEvent {
                turn,
                step: 1,
                call_id: call_id.clone(),
                name: "read".to_string(),
                arguments,
            },
        ))));
        let call_seq = call.seq;
        batch.push(call);
        batches.push(batch);

        // The tool result and step 2: durable before the second model request.
        let result = Message {
            id: MessageId::new(&format!("r-{turn}")).expect("valid id"),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call_id.clone(),
                content: vec![ContentBlock::text(self.text(turn, "file contents"))],
                is_error: None,
            }],
            source: MessageSource::tool(&call_id),
        };
        batches.push(vec![
            self.push(EventDraft::append(
                EventData::ToolResult(Box::new(ToolResultEvent {
                    turn,
                    step: 1,
                    message: Arc::new(result),
                    error: None,
                    meta: None,
                })),
                Some(vec![call_seq]),
            )),
            self.push(EventDraft::log(EventData::StepEnd(StepRef {
                turn,
                step: 1,
            }))),
            self.push(EventDraft::log(EventData::StepStart(StepRef {
                turn,
                step: 2,
            }))),
        ]);

        // The answer and the turn end.
        let answer = self.text(turn, "answer");
        let mut batch = self.text_block(turn, 2, &[&answer]);
        batch.extend([
            self.chunk(turn, 2, StreamChunk::Usage { usage: usage() }),
            self.chunk(turn, 2, StreamChunk::finish(FinishReason::Stop)),
        ]);
        let chunk_seqs: Vec<u64> = batch.iter().map(|e| e.seq).collect();
        batch.push(self.push(EventDraft::append(
            EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                turn,
                step: 2,
                message: Arc::new(Message {
                    id: MessageId::new(&format!("a-{turn}-2")).expect("valid id"),
                    role: Role::Assistant,
                    content: vec![ContentBlock::text(answer)],
                    source: MessageSource::model("sim", "sim-1"),
                }),
                usage: Some(usage()),
                interrupted: None,
            })),
            Some(chunk_seqs),
        )));
        batch.push(self.push(EventDraft::log(EventData::StepEnd(StepRef {
            turn,
            step: 2,
        }))));
        batch.push(
            self.push(EventDraft::log(EventData::TurnEnd(Box::new(TurnEnd {
                turn,
                reason: TurnEndReason::Completed,
            })))),
        );
        batches.push(batch);
        batches
    }
}

fn usage() -> TokenUsage {
    TokenUsage {
        input_tokens: 1200,
        output_tokens: 85,
        cache_read_tokens: Some(1024),
        cache_write_tokens: None,
        reasoning_tokens: None,
    }
}

pub fn encode(events: &[Event]) -> Vec<EncodedEvent> {
    events.iter().map(EncodedEvent::encode).collect()
}

pub fn to_json(events: &[Event]) -> Vec<String> {
    events.iter().map(Event::to_json).collect()
}

pub fn kinds(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.kind().to_string()).collect()
}

/// FNV-1a over the JSON of a run of events: what the crash child reports per acknowledged batch.
pub fn fingerprint<'a>(jsons: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for json in jsons {
        for &b in json {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).expect("a valid test session id")
}
