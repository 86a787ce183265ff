//! The fields a foreach `message` template names, so that a missing one renders as the
//! zero value at run time and `validate` can warn about a field the query does not return.

/// The `.a.b.c` field chains inside the actions of a template (outside string literals).
pub fn field_chains(source: &str) -> Vec<Vec<String>> {
    let mut chains = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        scan_action(&after[..end], &mut chains);
        rest = &after[end + 2..];
    }
    chains
}

/// The row columns a template names: the first field of each chain outside `range` and
/// `with` blocks (inside them `.` is no longer the row), each once, in order.
pub fn row_fields(source: &str) -> Vec<String> {
    let mut fields: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // The open blocks, innermost last: whether each rebinds `.`.
    let mut blocks: Vec<bool> = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let action = &after[..end];
        rest = &after[end + 2..];
        let words = action.trim_matches(|c: char| c == '-' || c.is_whitespace());
        let keyword = words.split_whitespace().next().unwrap_or_default();
        let rebound = blocks.iter().any(|r| *r);
        if !rebound {
            let mut chains = Vec::new();
            scan_action(action, &mut chains);
            for chain in chains {
                if let Some(first) = chain.into_iter().next()
                    && seen.insert(first.clone())
                {
                    fields.push(first);
                }
            }
        }
        match keyword {
            "range" | "with" => blocks.push(true),
            "if" | "block" => blocks.push(false),
            "end" => {
                blocks.pop();
            }
            _ => {}
        }
    }
    fields
}

fn scan_action(action: &str, chains: &mut Vec<Vec<String>>) {
    let chars: Vec<char> = action.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '`' || c == '\'' {
            // Skip a string, raw string or char literal.
            let quote = c;
            i += 1;
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' && quote != '`' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        let prev = if i == 0 { ' ' } else { chars[i - 1] };
        // A chain starts at a `.` that follows a space, `(`, `|`, `-`, `=` or the start; `$.x`
        // and `$var.x` are skipped (variables are not the row).
        if c == '.' && (prev.is_whitespace() || matches!(prev, '(' | '|' | '-' | '=' | ',')) {
            let mut chain = Vec::new();
            while i < chars.len() && chars[i] == '.' {
                let start = i + 1;
                let mut j = start;
                while j < chars.len() && (chars[j].is_alphanumeric() || chars[j] == '_') {
                    j += 1;
                }
                if j == start {
                    break;
                }
                chain.push(chars[start..j].iter().collect::<String>());
                i = j;
            }
            if chain.is_empty() {
                // A bare `.` (the row itself) names no field.
                i += 1;
            } else if !chain[0].starts_with(|c: char| c.is_ascii_digit()) {
                chains.push(chain);
            }
            continue;
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_fields_leave_out_what_range_and_with_rebind() {
        let t = "{{.id}} {{if .due}}{{.due}}{{end}} {{range .tags}}{{.name}}{{end}} \
                 {{with .owner}}{{.email}}{{end}} {{- .title -}}";
        assert_eq!(row_fields(t), ["id", "due", "tags", "owner", "title"]);
    }
}
