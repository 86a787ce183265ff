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
