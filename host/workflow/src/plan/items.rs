//! Sequence items: the types of a step's turns (`user_message`, `foreach`,
//! `prevalidation`, write access) and their parsing.

use super::*;

/// What a turn is for; narrows its write access (spec section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// Normal work (the default).
    Execution,
    /// Writes learnings.
    Learning,
    /// Writes knowledgebase notes.
    Knowledgebase,
    /// Writes the database.
    Db,
}

/// One item of a message sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Item {
    /// Unique within the step.
    pub id: String,
    /// An optional label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the turn is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<ItemKind>,
    /// The type and its own fields.
    #[serde(flatten)]
    pub body: ItemBody,
}

/// An item's type with the fields that belong to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ItemBody {
    /// One turn.
    UserMessage {
        /// The user message.
        message: String,
        /// Narrows the step's write access for this turn.
        #[serde(skip_serializing_if = "Option::is_none")]
        write_access: Option<WriteAccess>,
    },
    /// One turn per row of a read-only query.
    Foreach {
        /// Read-only SQL against `db/db.sqlite`.
        source_sql: String,
        /// A Go `text/template` with the row bound to `.`.
        message: String,
        /// Caps the rows (capping is logged).
        #[serde(skip_serializing_if = "Option::is_none")]
        max_iterations: Option<u64>,
        /// Narrows the step's write access for these turns.
        #[serde(skip_serializing_if = "Option::is_none")]
        write_access: Option<WriteAccess>,
    },
    /// A validation gate with repair turns.
    Prevalidation {
        /// The gate's schema.
        #[serde(skip_serializing_if = "Option::is_none")]
        validation_schema: Option<ValidationSchema>,
        /// Older spelling of `validation_schema`.
        #[serde(skip_serializing_if = "Option::is_none")]
        prevalidation: Option<ValidationSchema>,
        /// In a `todo_task`'s messages: the corrective turns the gate allows (default 1, as
        /// in the original); a message sequence's gates have a fixed repair cap.
        #[serde(skip_serializing_if = "Option::is_none")]
        max_corrections: Option<u64>,
    },
}

impl ItemBody {
    /// The type name used in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Self::UserMessage { .. } => "user_message",
            Self::Foreach { .. } => "foreach",
            Self::Prevalidation { .. } => "prevalidation",
        }
    }

    /// The schema a prevalidation item declares itself, whichever key it used.
    pub fn own_schema(&self) -> Option<&ValidationSchema> {
        match self {
            Self::Prevalidation {
                validation_schema,
                prevalidation,
                ..
            } => validation_schema.as_ref().or(prevalidation.as_ref()),
            _ => None,
        }
    }

    /// The item's write access override, if any.
    pub fn write_access(&self) -> Option<&WriteAccess> {
        match self {
            Self::UserMessage { write_access, .. } | Self::Foreach { write_access, .. } => {
                write_access.as_ref()
            }
            Self::Prevalidation { .. } => None,
        }
    }
}

/// Per-folder write access of a turn (spec section 6). Absent means "as the step".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WriteAccess {
    /// Database mutations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db: Option<bool>,
    /// Writes to `knowledgebase/notes/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub knowledgebase: Option<bool>,
    /// Writes to `learnings/_global/`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learnings: Option<bool>,
}

pub(super) const ITEM_TYPES: &[(&str, &str)] = &[
    ("user_message", "user_message"),
    ("foreach", "foreach"),
    ("prevalidation", "prevalidation"),
];

pub(super) const ITEM_KINDS: &[(&str, ItemKind)] = &[
    ("execution", ItemKind::Execution),
    ("learning", ItemKind::Learning),
    ("knowledgebase", ItemKind::Knowledgebase),
    ("db", ItemKind::Db),
];

pub(super) const ITEM_TYPE_KEYS: &[(&str, &[&str])] = &[
    ("user_message", &["message", "write_access"]),
    (
        "foreach",
        &["message", "source_sql", "max_iterations", "write_access"],
    ),
    (
        "prevalidation",
        &["validation_schema", "prevalidation", "max_corrections"],
    ),
];

pub(super) fn parse_items(
    ctx: &mut Ctx,
    obj: &mut Obj,
    step_has_schema: bool,
    nesting: Nesting,
) -> Option<Vec<Item>> {
    if !obj.has("items") {
        obj.raw("items");
        ctx.error(
            &obj.path().key("items"),
            "missing: expected a non-empty array of items",
        );
        return None;
    }
    let raw = obj.raw("items")?;
    if raw.as_array().is_some_and(Vec::is_empty) {
        ctx.error(
            &obj.path().key("items"),
            "must not be empty: a message sequence needs at least one item",
        );
        return None;
    }
    let before = ctx.error_count();
    let items = obj.list(ctx, "items", |ctx, v, p| {
        parse_item(ctx, v, p, step_has_schema, nesting)
    })?;
    let mut seen = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        if !seen.insert(item.id.as_str()) {
            ctx.error(
                &obj.path().key("items").index(i).key("id"),
                format!("duplicate item id {} in this step", quote(&item.id)),
            );
        }
    }
    (ctx.error_count() == before).then_some(items)
}

pub(super) fn parse_item(
    ctx: &mut Ctx,
    value: &Value,
    path: JsonPath,
    step_has_schema: bool,
    nesting: Nesting,
) -> Option<Item> {
    let mut obj = Obj::new(ctx, value, path, "an item")?;
    let type_raw = obj.raw("type");
    if type_raw.and_then(Value::as_str) == Some("code") {
        // Do not list the code item's own keys as unknown: the one thing to do is migrate.
        let id = value.get("id").and_then(Value::as_str).unwrap_or("?");
        let how = match nesting {
            Nesting::Top => format!(
                "run the migration {CODE_ITEM_MIGRATION} (`trellis migrate WORKSPACE`) to turn it into a scripted regular step"
            ),
            Nesting::Orphan | Nesting::Route => format!(
                "{CODE_ITEM_MIGRATION} cannot convert code inside {}: move the script to a standalone regular step with declared_execution_mode \"scripted\"",
                if nesting == Nesting::Orphan {
                    "an orphan step"
                } else {
                    "a route's sub-agent step"
                }
            ),
        };
        ctx.error(
            &obj.path().key("type"),
            format!(
                "legacy \"code\" item {} is not supported since contract v1.0.10: {how}",
                quote(id)
            ),
        );
        return None;
    }
    let id = obj.req_str(ctx, "id", "the item id, unique within the step");
    if let Some(id) = &id {
        crate::diagnostics::check_plain_id(ctx, &obj.path().key("id"), "item id", id);
    }
    let title = obj.str(ctx, "title");
    let kind = obj.one_of(ctx, "kind", ITEM_KINDS);
    let type_name = match type_raw {
        None => {
            ctx.error(
                &obj.path().key("type"),
                "missing: expected one of \"user_message\", \"foreach\", \"prevalidation\"",
            );
            None
        }
        Some(Value::String(t)) => enum_value(ctx, &obj.path().key("type"), t, ITEM_TYPES),
        Some(other) => {
            ctx.error(
                &obj.path().key("type"),
                format!("expected a string, found {}", kind_of(other)),
            );
            None
        }
    };
    if type_name.is_none() {
        for (_, keys) in ITEM_TYPE_KEYS {
            obj.accept(keys);
        }
    }
    if let Some(t) = type_name {
        let own = ITEM_TYPE_KEYS
            .iter()
            .find(|(n, _)| *n == t)
            .map(|(_, k)| *k)
            .unwrap_or(&[]);
        // The original writes `"write_access": {}` on every item, gates included.
        if t == "prevalidation"
            && obj
                .map()
                .get("write_access")
                .is_some_and(|w| w.as_object().is_some_and(|m| m.is_empty()))
        {
            obj.accept(&["write_access"]);
        }
        for (other, keys) in ITEM_TYPE_KEYS {
            for key in keys.iter().filter(|k| !own.contains(k)) {
                if obj.has(key) && !obj.known(key) {
                    obj.accept(&[key]);
                    ctx.error(
                        &obj.path().key(key),
                        format!("applies to {other} items, not to a {t} item"),
                    );
                }
            }
        }
    }
    let body = match type_name {
        Some("user_message") => {
            let message = obj.req_str(ctx, "message", "the user message");
            let write_access = parse_write_access(ctx, &mut obj);
            message.map(|message| ItemBody::UserMessage {
                message,
                write_access,
            })
        }
        Some("foreach") => {
            let source_sql = obj.req_str(ctx, "source_sql", "read-only SQL against db/db.sqlite");
            let message = obj.req_str(ctx, "message", "the message template rendered per row");
            if let Some(message) = &message
                && let Err(e) = crate::go_template::parse(message)
            {
                ctx.error(
                    &obj.path().key("message"),
                    if message.matches("{{").count() > message.matches("}}").count() {
                        "not a valid Go template: a `{{` is not closed by `}}`".to_string()
                    } else {
                        format!("not a valid Go template: {e}")
                    },
                );
            }
            let max_iterations = obj.u64(ctx, "max_iterations");
            if max_iterations == Some(0) {
                ctx.error(
                    &obj.path().key("max_iterations"),
                    "must be greater than 0 (leave it out for no cap)",
                );
            }
            let write_access = parse_write_access(ctx, &mut obj);
            match (source_sql, message) {
                (Some(source_sql), Some(message)) => Some(ItemBody::Foreach {
                    source_sql,
                    message,
                    max_iterations,
                    write_access,
                }),
                _ => None,
            }
        }
        Some(_) => {
            let validation_schema = obj
                .raw("validation_schema")
                .and_then(|v| parse_schema(ctx, v, obj.path().key("validation_schema")));
            let prevalidation = obj
                .raw("prevalidation")
                .and_then(|v| parse_schema(ctx, v, obj.path().key("prevalidation")));
            if validation_schema.is_none() && prevalidation.is_none() && !step_has_schema {
                ctx.error(
                    obj.path(),
                    "a prevalidation item needs a schema: add \"validation_schema\" to the item or to its step",
                );
            }
            let max_corrections = obj.u64(ctx, "max_corrections");
            Some(ItemBody::Prevalidation {
                validation_schema,
                prevalidation,
                max_corrections,
            })
        }
        None => None,
    };
    obj.finish(ctx);
    Some(Item {
        id: id?,
        title,
        kind,
        body: body?,
    })
}

pub(super) fn parse_write_access(ctx: &mut Ctx, obj: &mut Obj) -> Option<WriteAccess> {
    let v = obj.raw("write_access")?;
    let path = obj.path().key("write_access");
    let mut wa = Obj::new(ctx, v, path.clone(), "write access")?;
    for key in ["path", "paths", "file", "files"] {
        if wa.has(key) {
            wa.accept(&[key]);
            ctx.error(
                &path.key(key),
                "write access is per folder, never per file: remove it and use {\"db\", \"knowledgebase\", \"learnings\"} booleans",
            );
        }
    }
    let access = WriteAccess {
        db: wa.bool(ctx, "db"),
        knowledgebase: wa.bool(ctx, "knowledgebase"),
        learnings: wa.bool(ctx, "learnings"),
    };
    wa.finish(ctx);
    if access != WriteAccess::default() && access.db != Some(true) {
        ctx.warning(
            &path,
            "this turn cannot modify the database (db/db.sqlite, db/assets/): a write_access \
             names exactly the stores the turn may write, and \"db\" is not true here (add \
             \"db\": true to keep it)",
        );
    }
    Some(access)
}
