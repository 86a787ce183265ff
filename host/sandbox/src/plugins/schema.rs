//! Bounds on a tool's argument schema, checked when the plugin loads.
//!
//! Checking arguments against a schema can cost time exponential in the schema's
//! size: a `$ref` or an `anyOf` branch is evaluated once per path that reaches it, so
//! sixteen levels of `anyOf: [{$ref: next}, {$ref: next}]` in 1.5 KB mean 65,536
//! evaluations of the last one for every value. A schema is refused unless its text,
//! its nesting and the number of schema nodes reached through every `$ref` path are
//! small. Recursive references (a `$ref` back into a schema it is inside of) count
//! once: what they cost follows the arguments' depth, which the call's deadline
//! bounds (see `ToolSpec::check_arguments_within`).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Largest schema text, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Deepest nesting of objects and arrays in a schema.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// Most `$ref`s in a schema.
pub const MAX_SCHEMA_REFS: usize = 256;
/// Most schema nodes reached when every `$ref` is expanded in place.
pub const MAX_SCHEMA_EXPANSION: u64 = 10_000;

/// Keywords whose values are data, not schemas.
const DATA_KEYWORDS: &[&str] = &["enum", "const", "examples", "default"];
/// Keywords holding schemas that are reached only through a `$ref`.
const DEFINITION_KEYWORDS: &[&str] = &["$defs", "definitions"];

/// Checks `text`, the schema as the plugin listed it, and `schema`, parsed from it.
pub fn check_bounds(text: &str, schema: &Value) -> Result<(), String> {
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "input-schema is {} bytes, over the limit of {MAX_SCHEMA_BYTES}",
            text.len()
        ));
    }
    let depth = depth(schema);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "input-schema nests {depth} levels deep, over the limit of {MAX_SCHEMA_DEPTH}"
        ));
    }
    let mut refs = 0;
    count_refs(schema, &mut refs)?;
    if refs > MAX_SCHEMA_REFS {
        return Err(format!(
            "input-schema has {refs} `$ref`s, over the limit of {MAX_SCHEMA_REFS}"
        ));
    }
    let mut walk = Expansion {
        root: schema,
        memo: HashMap::new(),
        open: HashSet::new(),
    };
    let nodes = walk.count(schema)?;
    if nodes > MAX_SCHEMA_EXPANSION {
        return Err(format!(
            "input-schema expands to more than {MAX_SCHEMA_EXPANSION} schemas when its `$ref`s are followed (checking arguments against it could take exponential time)"
        ));
    }
    Ok(())
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn count_refs(value: &Value, refs: &mut usize) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                if key == "$dynamicRef" || key == "$recursiveRef" {
                    return Err(format!("input-schema: `{key}` is not supported"));
                }
                if key == "$ref" {
                    *refs += 1;
                }
                count_refs(child, refs)?;
            }
        }
        Value::Array(items) => {
            for item in items {
                count_refs(item, refs)?;
            }
        }
        _ => {}
    }
    Ok(())
}

struct Expansion<'a> {
    root: &'a Value,
    /// Expanded size of each `$ref` target, by address.
    memo: HashMap<*const Value, u64>,
    /// Targets being expanded: a `$ref` to one of them is recursion.
    open: HashSet<*const Value>,
}

impl<'a> Expansion<'a> {
    /// Schema nodes under `value` with every `$ref` expanded, saturating just past the cap.
    fn count(&mut self, value: &'a Value) -> Result<u64, String> {
        let mut total: u64 = 0;
        match value {
            Value::Object(map) => {
                total = 1;
                for (key, child) in map {
                    if key == "$ref" {
                        let reference = child
                            .as_str()
                            .ok_or("input-schema: `$ref` must be a string")?;
                        total = total.saturating_add(self.follow(reference)?);
                    } else if !DATA_KEYWORDS.contains(&key.as_str())
                        && !DEFINITION_KEYWORDS.contains(&key.as_str())
                    {
                        total = total.saturating_add(self.count(child)?);
                    }
                    if total > MAX_SCHEMA_EXPANSION {
                        break;
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    total = total.saturating_add(self.count(item)?);
                    if total > MAX_SCHEMA_EXPANSION {
                        break;
                    }
                }
            }
            _ => {}
        }
        Ok(total)
    }

    fn follow(&mut self, reference: &str) -> Result<u64, String> {
        let target = resolve(self.root, reference)?;
        let key = target as *const Value;
        if self.open.contains(&key) {
            return Ok(1);
        }
        if let Some(&known) = self.memo.get(&key) {
            return Ok(known);
        }
        self.open.insert(key);
        let size = self.count(target);
        self.open.remove(&key);
        let size = size?;
        self.memo.insert(key, size);
        Ok(size)
    }
}

/// The schema a local `$ref` (`#` or `#/json/pointer`) points at.
fn resolve<'a>(root: &'a Value, reference: &str) -> Result<&'a Value, String> {
    let Some(pointer) = reference.strip_prefix('#') else {
        return Err(format!(
            "input-schema: `$ref` {reference:?} is not local (only `#/...` references are allowed)"
        ));
    };
    let decoded = percent_decode(pointer);
    root.pointer(&decoded)
        .ok_or_else(|| format!("input-schema: `$ref` {reference:?} points at nothing"))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(schema: &Value) -> Result<(), String> {
        check_bounds(&schema.to_string(), schema)
    }

    /// The schema of the issue: `levels` definitions, each an `anyOf` of two `$ref`s
    /// to the next.
    fn ref_bomb(levels: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..levels {
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"$ref": format!("#/$defs/d{}", i + 1)}]}),
            );
        }
        defs.insert(format!("d{levels}"), json!({"type": "string"}));
        json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "$defs": defs})
    }

    #[test]
    fn a_ref_bomb_is_refused_and_the_check_is_quick() {
        let bomb = ref_bomb(16);
        assert!(bomb.to_string().len() < 2000);
        let err = check(&bomb).unwrap_err();
        assert!(err.contains("expands to more than 10000 schemas"), "{err}");
        // Memoized: even a thousand levels are measured at once.
        assert!(check(&ref_bomb(200)).is_err());
        // A few levels are fine.
        check(&ref_bomb(5)).unwrap();
    }

    #[test]
    fn ordinary_and_recursive_schemas_pass() {
        check(&json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})).unwrap();
        let tree = json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/node"}},
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}}
        });
        check(&tree).unwrap();
    }

    #[test]
    fn size_depth_refs_and_foreign_refs_are_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..40 {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(check(&deep).unwrap_err().contains("over the limit of 32"));
        let big = json!({"type": "object", "description": "x".repeat(70_000)});
        assert!(check(&big).unwrap_err().contains("over the limit of 65536"));
        let props: serde_json::Map<String, Value> = (0..300)
            .map(|i| (format!("p{i}"), json!({"$ref": "#/$defs/s"})))
            .collect();
        let many =
            json!({"type": "object", "properties": props, "$defs": {"s": {"type": "string"}}});
        assert!(
            check(&many)
                .unwrap_err()
                .contains("300 `$ref`s, over the limit of 256")
        );
        let remote = json!({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}});
        assert!(check(&remote).unwrap_err().contains("is not local"));
        let dynamic = json!({"type": "object", "$dynamicRef": "#meta"});
        assert!(
            check(&dynamic)
                .unwrap_err()
                .contains("`$dynamicRef` is not supported")
        );
    }
}
