//! Tool names as model APIs accept them, and back.
//!
//! Trellis names tools `server:tool`; OpenAI-style and Anthropic APIs want tool
//! names matching `^[a-zA-Z0-9_-]{1,64}$`. A name made of allowed characters and one
//! `:` becomes `server__tool`, which stays readable for the model. Any other
//! name, and any name whose readable form is taken by another tool of the same
//! request or is too long, becomes a sanitized prefix plus a hash of the full
//! name. Both forms depend only on the names offered, so a conversation maps
//! the same way on every call, and [`NameMap::original`] maps the model's
//! answer back exactly.

use std::collections::BTreeMap;

/// Longest function name the APIs accept.
pub const MAX_LEN: usize = 64;

/// The names of one request: original to API form and back.
#[derive(Debug, Default, Clone)]
pub struct NameMap {
    to_api: BTreeMap<String, String>,
    to_original: BTreeMap<String, String>,
}

impl NameMap {
    /// Builds the map for the tools offered in a request.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let names: Vec<&str> = names.into_iter().collect();
        let mut readable_count: BTreeMap<String, usize> = BTreeMap::new();
        for name in &names {
            if let Some(readable) = readable(name) {
                *readable_count.entry(readable).or_default() += 1;
            }
        }
        let mut map = NameMap::default();
        for name in names {
            if map.to_api.contains_key(name) {
                continue;
            }
            let api = match readable(name) {
                Some(r) if readable_count[&r] == 1 => r,
                _ => hashed(name),
            };
            map.to_original.insert(api.clone(), name.to_string());
            map.to_api.insert(name.to_string(), api);
        }
        map
    }

    /// The API form of `name`. A name not offered in the request (say, a tool
    /// call in the history of a tool since withdrawn) is mapped the same way.
    pub fn api(&self, name: &str) -> String {
        match self.to_api.get(name) {
            Some(api) => api.clone(),
            None => readable(name).unwrap_or_else(|| hashed(name)),
        }
    }

    /// The original name of an API name the model used; an unknown name is
    /// returned as is, so the host reports it as an unknown tool.
    pub fn original(&self, api: &str) -> String {
        self.to_original
            .get(api)
            .cloned()
            .unwrap_or_else(|| api.to_string())
    }
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `server__tool` when that is valid and cannot be confused with a hashed name.
fn readable(name: &str) -> Option<String> {
    let (server, tool) = name.split_once(':').unwrap_or(("", name));
    let parts_ok = [server, tool].iter().all(|p| p.chars().all(allowed));
    let form = if server.is_empty() {
        tool.to_string()
    } else {
        format!("{server}__{tool}")
    };
    let ok = parts_ok && !tool.is_empty() && form.len() <= MAX_LEN && !looks_hashed(&form);
    ok.then_some(form)
}

/// `<sanitized prefix>_h<16 hex>`: unique per name, always valid.
fn hashed(name: &str) -> String {
    let suffix = format!("_h{:016x}", fnv1a(name.as_bytes()));
    let prefix: String = name
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .take(MAX_LEN - suffix.len())
        .collect();
    format!("{prefix}{suffix}")
}

fn looks_hashed(form: &str) -> bool {
    form.len() >= 18 && {
        let tail = &form[form.len() - 18..];
        tail.starts_with("_h") && tail[2..].chars().all(|c| c.is_ascii_hexdigit())
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(api: &str) -> bool {
        !api.is_empty() && api.len() <= MAX_LEN && api.chars().all(allowed)
    }

    #[test]
    fn names_map_to_valid_forms_and_back_exactly() {
        let names = [
            "workspace:read_file",
            "db.tools:run.query",
            "a__b:c",
            "a:b__c",
            "weird name:ü",
            "x:y",
            &"long".repeat(30),
        ];
        let map = NameMap::new(names.iter().copied());
        let mut seen = std::collections::BTreeSet::new();
        for name in names {
            let api = map.api(name);
            assert!(valid(&api), "{api}");
            assert!(seen.insert(api.clone()), "collision on {api}");
            assert_eq!(map.original(&api), name);
        }
        assert_eq!(map.api("workspace:read_file"), "workspace__read_file");
        // `a__b:c` and `a:b__c` would both read `a__b__c`: both are hashed.
        assert_ne!(map.api("a__b:c"), "a__b__c");
    }

    #[test]
    fn mapping_is_deterministic_across_requests() {
        let one = NameMap::new(["db.tools:run.query", "x:y"]);
        let two = NameMap::new(["x:y", "db.tools:run.query"]);
        assert_eq!(one.api("db.tools:run.query"), two.api("db.tools:run.query"));
    }
}
