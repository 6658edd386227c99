//! Scratch: event parse speed.
use dsh::session::Event;
fn main() {
    let lines: Vec<String> = (0..1000).map(|i| format!(r#"{{"type":"assistant/chunk","seq":{i},"time":1796013101212,"data":{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":"word{i} "}}}}}}"#)).collect();
    let t = std::time::Instant::now();
    let mut n = 0;
    for _ in 0..600 {
        for l in &lines {
            let e = Event::from_json(l).unwrap();
            n += e.seq;
        }
    }
    let el = t.elapsed();
    println!("{:.0} ns/event ({n})", el.as_nanos() as f64 / 600_000.0);
    if std::env::args().nth(1).as_deref() == Some("sizes") {
        sizes();
        return;
    }
    if std::env::args().nth(1).is_some() {
        return;
    }
    let t = std::time::Instant::now();
    for _ in 0..200 {
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            n += v["seq"].as_u64().unwrap();
        }
    }
    println!(
        "Value baseline {:.0} ns/event",
        t.elapsed().as_nanos() as f64 / 200_000.0
    );
}
#[allow(dead_code)]
fn sizes() {
    use dsh::llm::types::*;
    use dsh::session::event::*;
    println!(
        "Event {} EventData {} StreamChunk {} AssistantChunk {} RequestHeaderEvent {} LlmRetry {} TurnEnd {} ToolCallEvent {} InboxSpliced {} AssistantMessageEvent {} ToolResultEvent {} FinishReason {} LlmFailure {} ContentBlock {} TokenUsage {} RequestContext {}",
        std::mem::size_of::<Event>(),
        std::mem::size_of::<EventData>(),
        std::mem::size_of::<StreamChunk>(),
        std::mem::size_of::<AssistantChunk>(),
        std::mem::size_of::<RequestHeaderEvent>(),
        std::mem::size_of::<LlmRetry>(),
        std::mem::size_of::<TurnEnd>(),
        std::mem::size_of::<ToolCallEvent>(),
        std::mem::size_of::<InboxSpliced>(),
        std::mem::size_of::<AssistantMessageEvent>(),
        std::mem::size_of::<ToolResultEvent>(),
        std::mem::size_of::<FinishReason>(),
        std::mem::size_of::<LlmFailure>(),
        std::mem::size_of::<ContentBlock>(),
        std::mem::size_of::<TokenUsage>(),
        std::mem::size_of::<RequestContext>()
    );
}
