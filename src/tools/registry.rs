//! `ToolRegistry`: tools by name, with their schemas in canonical (lexicographic) order.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::llm::types::ToolSchema;
use crate::tools::{ExecutionMode, Tool, ToolArgs};

/// Tools visible to an agent. Cheap to clone.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    /// Invariant: keyed by `tool.name()`; iteration order is the canonical header order.
    ///
    /// Shared: every agent of a host holds the same map until one registers a tool of its own
    /// (copy on write), so a clone costs a reference count.
    by_name: Arc<BTreeMap<String, Arc<dyn Tool>>>,
}

impl ToolRegistry {
    /// No tools.
    pub fn new() -> ToolRegistry {
        ToolRegistry::default()
    }

    /// Registers `tool`, replacing any earlier tool of the same name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        Arc::make_mut(&mut self.by_name).insert(tool.name().to_string(), tool);
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

    /// Merges `other` over `self` (per-agent tools over host tools).
    pub fn layered(&self, other: &ToolRegistry) -> ToolRegistry {
        if other.by_name.is_empty() {
            return self.clone();
        }
        let mut by_name = (*self.by_name).clone();
        for (k, v) in other.by_name.iter() {
            by_name.insert(k.clone(), Arc::clone(v));
        }
        ToolRegistry {
            by_name: Arc::new(by_name),
        }
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}
