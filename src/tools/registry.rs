//! `ToolRegistry`: tools by name, with their schemas in canonical (lexicographic) order.
//!
//! Most tools are fixed for the life of a host, but some come from a source whose tool set can change
//! while agents run (an MCP server that sends `notifications/tools/list_changed`). Such a source is a
//! `ToolSource`: a generation counter and its current tools. A registry with sources keeps its layers
//! (fixed maps and sources, later layers winning on a name) and rebuilds its view when `refresh`
//! sees a source's generation move; the turn machine refreshes at each step start, so a change is
//! picked up at the next step (and the `request/header` of that step lists the new tools).

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use crate::llm::types::ToolSchema;
use crate::tools::{ExecutionMode, Tool, ToolArgs};

/// A set of tools that may change while agents run.
pub trait ToolSource: Send + Sync {
    /// A counter that moves whenever `tools` would answer differently. Read at every step start of
    /// every agent holding the source, so it must be cheap (an atomic load).
    fn generation(&self) -> u64;

    /// The current tools.
    fn tools(&self) -> Vec<Arc<dyn Tool>>;
}

type ByName = BTreeMap<String, Arc<dyn Tool>>;

/// One layer of a registry with sources.
#[derive(Clone)]
enum Layer {
    /// Tools registered directly.
    Fixed(Arc<ByName>),
    /// A changing source.
    Source(Arc<dyn ToolSource>),
}

/// Tools visible to an agent. Cheap to clone.
#[derive(Clone)]
pub struct ToolRegistry {
    /// The view: every tool by name; iteration order is the canonical header order.
    ///
    /// Shared: every agent of a host holds the same map until one registers a tool of its own
    /// (copy on write), so a clone costs a reference count.
    by_name: Arc<ByName>,
    /// Empty when the registry has no source (then `by_name` is all there is); otherwise the layers,
    /// in order (a later layer wins on a name), whose fold is `by_name`.
    layers: Arc<Vec<Layer>>,
    /// Each source layer's generation as of `by_name`, in layer order.
    seen: Arc<Vec<u64>>,
}

impl Default for ToolRegistry {
    /// No tools. Every empty registry shares one set of empty maps (a registration copies them
    /// first), so the empty registry of each `AgentSpec` of a fleet costs no allocation.
    fn default() -> ToolRegistry {
        static EMPTY: LazyLock<ToolRegistry> = LazyLock::new(|| ToolRegistry {
            by_name: Arc::new(ByName::new()),
            layers: Arc::new(Vec::new()),
            seen: Arc::new(Vec::new()),
        });
        EMPTY.clone()
    }
}

impl ToolRegistry {
    /// No tools.
    pub fn new() -> ToolRegistry {
        ToolRegistry::default()
    }

    /// Registers `tool`, replacing any earlier tool of the same name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        if !self.layers.is_empty() {
            let layers = Arc::make_mut(&mut self.layers);
            match layers.last_mut() {
                Some(Layer::Fixed(map)) => {
                    Arc::make_mut(map).insert(tool.name().to_string(), Arc::clone(&tool));
                }
                _ => {
                    let mut map = ByName::new();
                    map.insert(tool.name().to_string(), Arc::clone(&tool));
                    layers.push(Layer::Fixed(Arc::new(map)));
                }
            }
        }
        Arc::make_mut(&mut self.by_name).insert(tool.name().to_string(), tool);
    }

    /// Adds a changing source of tools over the tools registered so far (its tools win on a name).
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>) {
        let layers = Arc::make_mut(&mut self.layers);
        if layers.is_empty() && !self.by_name.is_empty() {
            layers.push(Layer::Fixed(Arc::clone(&self.by_name)));
        }
        layers.push(Layer::Source(source));
        self.rebuild();
    }

    /// Whether some tools come from a source that can change.
    pub fn has_sources(&self) -> bool {
        !self.layers.is_empty()
    }

    /// Takes in the sources' changes since the last refresh; returns whether the tools changed.
    /// Without sources this is one branch.
    pub fn refresh(&mut self) -> bool {
        if self.layers.is_empty() {
            return false;
        }
        let moved = self
            .layers
            .iter()
            .filter_map(|l| match l {
                Layer::Source(s) => Some(s.generation()),
                Layer::Fixed(_) => None,
            })
            .ne(self.seen.iter().copied());
        if moved {
            self.rebuild();
        }
        moved
    }

    /// Folds the layers into the view and notes each source's generation.
    fn rebuild(&mut self) {
        let mut by_name = ByName::new();
        let mut seen = Vec::new();
        for layer in self.layers.iter() {
            match layer {
                Layer::Fixed(map) => {
                    for (k, v) in map.iter() {
                        by_name.insert(k.clone(), Arc::clone(v));
                    }
                }
                Layer::Source(source) => {
                    // The generation is read before the tools, so a change racing this rebuild
                    // leaves a generation behind and is taken in at the next refresh.
                    seen.push(source.generation());
                    for tool in source.tools() {
                        by_name.insert(tool.name().to_string(), tool);
                    }
                }
            }
        }
        self.by_name = Arc::new(by_name);
        self.seen = Arc::new(seen);
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name)
    }

    /// No tool is registered.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Schemas in canonical order (by name), as logged in `request/header`.
    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.by_name.values().map(|t| t.schema()).collect()
    }

    /// The execution mode of one call: unknown tools (and anything that fails to classify) are
    /// exclusive, so a mistake can only cost concurrency, never safety.
    pub fn execution_mode(&self, name: &str, raw_arguments: &str) -> ExecutionMode {
        match self.by_name.get(name) {
            None => ExecutionMode::Exclusive,
            Some(tool) => {
                let args = ToolArgs::parse(raw_arguments);
                let tool = Arc::clone(tool);
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tool.execution_mode(&args)
                })) {
                    Ok(mode) => mode,
                    Err(_) => ExecutionMode::Exclusive,
                }
            }
        }
    }

    /// Merges `other` over `self` (per-agent tools over host tools). Sources of either stay
    /// sources of the result.
    pub fn layered(&self, other: &ToolRegistry) -> ToolRegistry {
        if other.by_name.is_empty() && other.layers.is_empty() {
            return self.clone();
        }
        if self.layers.is_empty() && other.layers.is_empty() {
            let mut by_name = (*self.by_name).clone();
            for (k, v) in other.by_name.iter() {
                by_name.insert(k.clone(), Arc::clone(v));
            }
            return ToolRegistry {
                by_name: Arc::new(by_name),
                ..ToolRegistry::default()
            };
        }
        let mut layers = self.as_layers();
        layers.extend(other.as_layers());
        let mut merged = ToolRegistry {
            layers: Arc::new(layers),
            ..ToolRegistry::default()
        };
        merged.rebuild();
        merged
    }

    /// This registry as layers (one fixed layer when it has no source).
    fn as_layers(&self) -> Vec<Layer> {
        if !self.layers.is_empty() {
            (*self.layers).clone()
        } else if self.by_name.is_empty() {
            Vec::new()
        } else {
            vec![Layer::Fixed(Arc::clone(&self.by_name))]
        }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolInvocation, ToolOutput};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Named(String, &'static str);

    #[async_trait::async_trait]
    impl Tool for Named {
        fn name(&self) -> &str {
            &self.0
        }
        fn description(&self) -> &str {
            self.1
        }
        fn parameters(&self) -> serde_json::Value {
            serde_json::json!({"type": "object"})
        }
        async fn execute(
            &self,
            _call: ToolInvocation,
            _cancel: tokio_util::sync::CancellationToken,
        ) -> ToolOutput {
            ToolOutput::text("")
        }
    }

    fn named(name: &str, from: &'static str) -> Arc<dyn Tool> {
        Arc::new(Named(name.into(), from))
    }

    #[derive(Default)]
    struct Source {
        generation: AtomicU64,
        tools: Mutex<Vec<Arc<dyn Tool>>>,
    }

    impl Source {
        fn set(&self, names: &[&str]) {
            *self.tools.lock().unwrap() = names.iter().map(|n| named(n, "source")).collect();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    impl ToolSource for Source {
        fn generation(&self) -> u64 {
            self.generation.load(Ordering::Acquire)
        }
        fn tools(&self) -> Vec<Arc<dyn Tool>> {
            self.tools.lock().unwrap().clone()
        }
    }

    fn view(r: &ToolRegistry) -> Vec<(String, String)> {
        r.by_name
            .values()
            .map(|t| (t.name().to_string(), t.description().to_string()))
            .collect()
    }

    #[test]
    fn a_source_change_is_seen_only_at_refresh_and_later_layers_win() {
        let source = Arc::new(Source::default());
        source.set(&["a", "shared"]);
        let mut host = ToolRegistry::new();
        host.register(named("shared", "host"));
        host.add_source(Arc::clone(&source) as Arc<dyn ToolSource>);
        let mut agent_own = ToolRegistry::new();
        agent_own.register(named("a", "agent"));
        let mut agent = host.layered(&agent_own);
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(view(&agent), pairs(&[("a", "agent"), ("shared", "source")]));
        assert!(!agent.refresh(), "nothing moved");
        source.set(&["b"]);
        assert_eq!(view(&agent).len(), 2, "unchanged until refreshed");
        assert!(agent.refresh());
        assert_eq!(
            view(&agent),
            pairs(&[("a", "agent"), ("b", "source"), ("shared", "host")])
        );
        assert!(!agent.refresh());
        // A tool registered later goes over the source.
        agent.register(named("b", "late"));
        source.set(&["b", "c"]);
        assert!(agent.refresh());
        assert_eq!(
            view(&agent),
            pairs(&[
                ("a", "agent"),
                ("b", "late"),
                ("c", "source"),
                ("shared", "host")
            ])
        );
    }

    #[test]
    fn a_registry_without_sources_never_refreshes() {
        let mut r = ToolRegistry::new();
        r.register(named("x", "fixed"));
        assert!(!r.has_sources());
        assert!(!r.refresh());
        let merged = r.layered(&ToolRegistry::new());
        assert_eq!(view(&merged), vec![("x".to_string(), "fixed".to_string())]);
    }
}
