//! Hosts many agents in one process: creates N agents over the simulated model, sends each one
//! prompt at once, and waits until all are idle. `cargo run --release --example many_agents -- 1000`.

use std::sync::Arc;
use std::time::Instant;

use dsh::ids::MessageId;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::llm::types::Message;
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, Host};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(SimConfig::instant(7))?));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let host = Host::builder(store).providers(providers).start().await?;

    let started = Instant::now();
    let mut agents = Vec::with_capacity(n);
    for _ in 0..n {
        agents.push(
            host.create(AgentSpec::new(AgentConfig::new("sim", "sim-1")))
                .await?,
        );
    }
    let created = started.elapsed();

    let started = Instant::now();
    let sends = agents
        .iter()
        .map(|a| a.followup(Message::user_text(MessageId::mint(), "Say something.")));
    for r in futures::future::join_all(sends).await {
        r?;
    }
    for r in futures::future::join_all(agents.iter().map(|a| a.when_idle())).await {
        r?;
    }
    let ran = started.elapsed();
    println!(
        "{n} agents: created in {created:?} ({:.0}/s); one turn each in {ran:?} ({:.0} turns/s, {} events)",
        n as f64 / created.as_secs_f64(),
        n as f64 / ran.as_secs_f64(),
        host.metrics().events()
    );
    host.shutdown().await;
    Ok(())
}
