//! Embedding dsh-rs: a host over the SQLite store and the simulated model, one agent, one prompt.
//! `cargo run --example embed` (writes to `./.dsh-example`).

use std::sync::Arc;

use dsh::MessageId;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::llm::types::Message;
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, Host};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sqlite = Arc::new(SqliteStore::open(
        std::path::Path::new(".dsh-example"),
        SqliteConfig::default(),
    )?);
    let store: Arc<dyn SessionStore> = sqlite.clone();
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(SimConfig::instant(7))?));
    // Failed requests (rate limits, server errors, timeouts) are retried under each provider's
    // policy; `.retry(dsh_actors::DefaultRetry::Off)` would turn that off, and `request_error`
    // hooks given to `.hooks(..)` would replace it.
    let host = Host::builder(store).providers(providers).start().await?;

    let agent = host
        .create(AgentSpec::new(AgentConfig::new("sim", "sim-1")))
        .await?;
    // Returns once the input is durable.
    agent
        .followup(Message::user_text(MessageId::mint(), "hello"))
        .await?;
    agent.when_idle().await?;
    for event in agent.log().await? {
        println!("{}", event.to_json());
    }
    host.shutdown().await;
    sqlite.close().await?;
    Ok(())
}
