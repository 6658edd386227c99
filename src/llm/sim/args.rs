//! Tool arguments generated from a JSON schema, deterministically from the simulator's generator:
//! objects, strings, numbers, integers, booleans, arrays, enums, `const`, required keys, and the
//! usual length and range keywords. Nesting is bounded, so a recursive schema still terminates.

use serde_json::{Map, Number, Value};

use super::WORDS;
use super::rng::SplitMix64;

/// Generated arguments nest at most this deep; deeper schemas get their simplest value.
const ARGS_DEPTH_MAX: usize = 8;

/// Generates a value that validates against `schema` (the subset in the module docs).
pub(super) fn generate_arguments(schema: &Value, rng: &mut SplitMix64) -> Value {
    gen_value(schema, rng, 0)
}

pub(super) fn schema_type(schema: &Value) -> &str {
    match schema.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if schema.get("properties").is_some() => "object",
        _ if schema.get("items").is_some() => "array",
        _ => "string",
    }
}

pub(super) fn bound(schema: &Value, key: &str) -> Option<f64> {
    schema
        .get(key)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite())
}

fn gen_value(schema: &Value, rng: &mut SplitMix64, depth: usize) -> Value {
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.is_empty()
    {
        return options[rng.below(options.len() as u64) as usize].clone();
    }
    match schema_type(schema) {
        "object" => {
            let mut out = Map::new();
            if depth >= ARGS_DEPTH_MAX {
                return Value::Object(out);
            }
            let required: Vec<&str> = match schema.get("required") {
                Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if let Some(Value::Object(props)) = schema.get("properties") {
                for (name, prop) in props {
                    if required.contains(&name.as_str()) || rng.below(2) == 0 {
                        out.insert(name.clone(), gen_value(prop, rng, depth + 1));
                    }
                }
            }
            for name in required {
                if !out.contains_key(name) {
                    out.insert(name.to_owned(), Value::String("x".into()));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(1);
            let max = schema
                .get("maxItems")
                .and_then(Value::as_u64)
                .unwrap_or(min.max(3))
                .max(min)
                .min(min + 8);
            if depth >= ARGS_DEPTH_MAX {
                return Value::Array(Vec::new());
            }
            let n = rng.between(min, max);
            let items = schema.get("items").cloned().unwrap_or(Value::Null);
            Value::Array((0..n).map(|_| gen_value(&items, rng, depth + 1)).collect())
        }
        "integer" => {
            let lo = bound(schema, "minimum")
                .or_else(|| bound(schema, "exclusiveMinimum").map(|v| v.floor() + 1.0))
                .unwrap_or(0.0)
                .ceil();
            let hi = bound(schema, "maximum")
                .or_else(|| bound(schema, "exclusiveMaximum").map(|v| v.ceil() - 1.0))
                .unwrap_or(lo.max(0.0) + 100.0)
                .floor()
                .max(lo);
            let span = (hi - lo).min(1e15) as u64;
            Value::Number(Number::from(
                (lo as i64).saturating_add(rng.between(0, span) as i64),
            ))
        }
        "number" => {
            let lo = bound(schema, "minimum").unwrap_or(0.0);
            let hi = bound(schema, "maximum").unwrap_or(lo + 100.0).max(lo);
            let v = lo + (hi - lo) * rng.unit();
            // Two decimals, kept inside the bounds.
            let v = ((v * 100.0).floor() / 100.0).clamp(lo, hi);
            Number::from_f64(v).map_or(Value::Null, Value::Number)
        }
        "boolean" => Value::Bool(rng.below(2) == 0),
        "null" => Value::Null,
        _ => {
            let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema
                .get("maxLength")
                .and_then(Value::as_u64)
                .map_or(usize::MAX, |m| m as usize)
                .max(min);
            let n_words = rng.between(1, 3);
            let mut s = String::new();
            for i in 0..n_words {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
            }
            while s.chars().count() < min {
                s.push('x');
            }
            if s.chars().count() > max {
                s = s.chars().take(max).collect();
            }
            Value::String(s)
        }
    }
}
