//! `workflow.json` `schedules[]`, in the original system's shape: when a workflow runs
//! itself. A schedule fires on a cron expression (five fields) or on calendar items (a date
//! and a time), in its IANA time zone; each firing is a builder session in run mode that
//! sends the schedule's `messages`. Its collision policy says what an occurrence does when
//! the workspace is busy, and `after_schedule_id` makes it wait for another schedule's
//! occurrence of the same local date. The server fires them (`trellis serve`); this module
//! reads, checks and evaluates them.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use serde::Serialize;
use serde_json::Value;

use crate::diagnostics::{Ctx, JsonPath, Obj, check_plain_id, did_you_mean, kind_of, quote};

/// The message a firing sends when its schedule gives none.
pub const DEFAULT_MESSAGE: &str = "Run the full workflow using run_full_workflow tool.";

/// Keys of a schedule the original writes that have no effect here: parsed, and named in a
/// warning.
pub const INERT_KEYS: &[&str] = &[
    "group_ids",
    "resume_previous",
    "pulse_review_only",
    "execution_mode",
    "direct_messages_reason",
    "query",
    "workshop_mode",
];

/// The schedules a workflow may have.
pub const MAX_SCHEDULES: usize = 100;

/// The calendar items of one schedule at most.
pub const MAX_CALENDAR_ITEMS: usize = 1000;

/// The calendar items of all a workflow's schedules together at most: the server reads them
/// for every scheduler request and checks them every second (100 schedules of 1,000 items,
/// a 15 MB `workflow.json`, held 1.15 GB in four requests at once).
pub const MAX_CALENDAR_ITEMS_TOTAL: usize = 10_000;

/// The JSON values of all a workflow's schedules together at most (each key and value of
/// theirs counts): the server holds them parsed and reads them for every scheduler request
/// (a schedule's `route_selections` of 500,000 entries, an 11.9 MB `workflow.json`, held
/// 1 GB in a server).
pub const MAX_SCHEDULE_VALUES: usize = 200_000;

/// The values of `value`, its keys counted as values too (as the JSON of a file counts).
fn json_values_of(value: &Value) -> usize {
    let mut count = 0;
    let mut open = vec![value];
    while let Some(v) = open.pop() {
        count += 1;
        match v {
            Value::Array(items) => open.extend(items),
            Value::Object(map) => {
                count += map.len();
                open.extend(map.values());
            }
            _ => {}
        }
    }
    count
}

/// The messages of one firing at most (a schedule's, a calendar item's): each is a turn.
pub const MAX_MESSAGES: usize = 50;

/// What an occurrence does when the workspace is busy (a run or a builder turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CollisionPolicy {
    /// It is recorded as skipped.
    #[default]
    Skip,
    /// Only the newest waiting occurrence is kept, and runs when the workspace frees.
    QueueLatest,
    /// Each waits its turn.
    Retry,
    /// It folds into the firing that runs.
    Coalesce,
}

/// Which end of the other schedule's occurrence releases a dependent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AfterStatus {
    /// It ended `success`.
    #[default]
    Completed,
    /// It ended, however.
    AnyTerminal,
}

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "schedule_type", rename_all = "snake_case")]
pub enum When {
    /// On a five-field cron expression.
    Cron {
        /// As written (`*/5 * * * *`).
        cron_expression: String,
    },
    /// On each calendar item's date and time.
    Calendar {
        /// The items, in the order written.
        calendar_items: Vec<CalendarItem>,
    },
}

/// One firing of a calendar schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalendarItem {
    /// Its id.
    pub id: String,
    /// The local date.
    pub date: NaiveDate,
    /// The local time.
    pub time: NaiveTime,
    /// What it is for.
    pub description: Option<String>,
    /// The messages of this firing (the schedule's when empty).
    pub messages: Vec<String>,
}

/// A dependency on another schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct After {
    /// The schedule waited for.
    pub schedule_id: String,
    /// Which end releases this one.
    pub status: AfterStatus,
    /// Minutes to wait after it ended.
    pub delay_minutes: u64,
    /// The local time (`HH:MM`) past which a waiting occurrence expires.
    pub deadline: Option<NaiveTime>,
}

/// One schedule of `workflow.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Schedule {
    /// Unique among the workflow's schedules.
    pub id: String,
    /// Its display name.
    pub name: Option<String>,
    /// What it is for.
    pub description: Option<String>,
    /// When it fires.
    #[serde(flatten)]
    pub when: When,
    /// The IANA time zone its times are in (`UTC` when absent).
    pub timezone: String,
    /// Whether it fires by itself (a disabled schedule can still be triggered by hand).
    pub enabled: bool,
    /// The groups a firing runs (ids or names).
    pub group_names: Vec<String>,
    /// Routes chosen for routing steps (step id -> route id).
    pub route_selections: BTreeMap<String, String>,
    /// The messages a firing sends, one by one ([`DEFAULT_MESSAGE`] when empty).
    pub messages: Vec<String>,
    /// What an occurrence does when the workspace is busy.
    pub collision_policy: CollisionPolicy,
    /// Minutes after its time past which an occurrence no longer starts.
    pub max_start_delay_minutes: Option<u64>,
    /// The schedule it waits for, if any.
    pub after: Option<After>,
}

impl Schedule {
    /// Its time zone.
    pub fn tz(&self) -> Tz {
        Tz::from_str(&self.timezone).unwrap_or(Tz::UTC)
    }

    /// The messages a firing sends.
    pub fn firing_messages(&self) -> Vec<String> {
        if self.messages.is_empty() {
            vec![DEFAULT_MESSAGE.to_string()]
        } else {
            self.messages.clone()
        }
    }

    /// Its first occurrence strictly after `after`, if any. Local times a change of the
    /// clocks skips fire at the first minute after the gap, and those it repeats fire once,
    /// at their first instance (as the cron crate documents for its occurrences; calendar
    /// items likewise).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let tz = self.tz();
        match &self.when {
            When::Cron { cron_expression } => {
                let cron = croner::Cron::from_str(cron_expression).ok()?;
                // Occurrences are whole minutes: the fraction of a second of `after` would be
                // carried into the one found.
                let after = after.with_nanosecond(0).unwrap_or(after);
                let local = after.with_timezone(&tz);
                cron.find_next_occurrence(&local, false)
                    .ok()
                    .map(|t| t.with_timezone(&Utc))
            }
            When::Calendar { calendar_items } => calendar_items
                .iter()
                .filter_map(|item| local_instant(&tz, item.date, item.time))
                .filter(|t| *t > after)
                .min(),
        }
    }

    /// The occurrences after `from` up to `to` (inclusive), oldest first, at most `max`.
    pub fn occurrences(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        max: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = from;
        while out.len() < max {
            match self.next_after(at) {
                Some(next) if next <= to => {
                    out.push(next);
                    at = next;
                }
                _ => break,
            }
        }
        out
    }

    /// The calendar item firing at `at`, if this is a calendar schedule.
    pub fn calendar_item_at(&self, at: DateTime<Utc>) -> Option<&CalendarItem> {
        let When::Calendar { calendar_items } = &self.when else {
            return None;
        };
        let tz = self.tz();
        calendar_items
            .iter()
            .find(|item| local_instant(&tz, item.date, item.time) == Some(at))
    }
}

/// The instant local `date` `time` is in `tz`: the first of a repeated hour, and for a time a
/// change of the clocks skips, the first minute after the gap.
pub fn local_instant(tz: &Tz, date: NaiveDate, time: NaiveTime) -> Option<DateTime<Utc>> {
    let local = date.and_time(time);
    let at = |minutes: i64| {
        tz.from_local_datetime(&(local + chrono::Duration::minutes(minutes)))
            .earliest()
    };
    if let Some(t) = at(0) {
        return Some(t.with_timezone(&Utc));
    }
    // In a gap (a day at most, as when a zone skipped a date): the first minute that
    // exists after it, found by halving (times past a gap exist, times in it do not).
    let (mut gone, mut there) = (0i64, 26 * 60);
    at(there)?;
    while there - gone > 1 {
        let mid = (gone + there) / 2;
        if at(mid).is_some() {
            there = mid;
        } else {
            gone = mid;
        }
    }
    at(there).map(|t| t.with_timezone(&Utc))
}

/// Reads `schedules` (the array of `workflow.json`), recording each problem in `ctx`;
/// `groups` are the workflow's. Returns the schedules that read without error.
pub(super) fn read_schedules(ctx: &mut Ctx, value: &Value) -> Vec<Schedule> {
    let path = JsonPath::root().key("schedules");
    let Value::Array(items) = value else {
        ctx.error(
            &path,
            format!("expected an array of schedules, found {}", kind_of(value)),
        );
        return Vec::new();
    };
    if items.len() > MAX_SCHEDULES {
        ctx.error(
            &path,
            format!(
                "{} schedules, more than the {MAX_SCHEDULES} a workflow may have",
                items.len()
            ),
        );
        return Vec::new();
    }
    let calendar: usize = items
        .iter()
        .filter_map(|s| s.get("calendar_items")?.as_array().map(Vec::len))
        .sum();
    if calendar > MAX_CALENDAR_ITEMS_TOTAL {
        ctx.error(
            &path,
            format!(
                "{calendar} calendar items in all, more than the {MAX_CALENDAR_ITEMS_TOTAL} the \
                 schedules of a workflow may have together"
            ),
        );
        return Vec::new();
    }
    let values: usize = items.iter().map(json_values_of).sum();
    if values > MAX_SCHEDULE_VALUES {
        ctx.error(
            &path,
            format!(
                "the schedules hold {values} JSON values in all (route_selections, \
                 group_names, messages, calendar items, ...), more than the \
                 {MAX_SCHEDULE_VALUES} the schedules of a workflow may hold together"
            ),
        );
        return Vec::new();
    }
    let mut out: Vec<(JsonPath, Schedule)> = Vec::new();
    let mut inert = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let p = path.index(i);
        if let Some(schedule) = read_one(ctx, item, p.clone(), &mut inert) {
            if out.iter().any(|(_, s)| s.id == schedule.id) {
                ctx.error(
                    &p.key("id"),
                    format!("duplicate schedule id {}", quote(&schedule.id)),
                );
                continue;
            }
            out.push((p, schedule));
        }
    }
    let ids: Vec<String> = out.iter().map(|(_, s)| s.id.clone()).collect();
    for (p, schedule) in &out {
        let Some(after) = &schedule.after else {
            continue;
        };
        let at = p.key("after_schedule_id");
        if after.schedule_id == schedule.id {
            ctx.error(&at, "a schedule cannot wait for itself");
        } else if !ids.contains(&after.schedule_id) {
            let hint = hint(did_you_mean(
                &after.schedule_id,
                ids.iter().map(String::as_str),
            ));
            ctx.error(
                &at,
                format!(
                    "no schedule {} to wait for{hint}",
                    quote(&after.schedule_id)
                ),
            );
        }
    }
    // A chain of waits that comes back to where it began never starts.
    let waits: BTreeMap<&str, &str> = out
        .iter()
        .filter_map(|(_, s)| Some((s.id.as_str(), s.after.as_ref()?.schedule_id.as_str())))
        .collect();
    let mut reported = BTreeSet::new();
    for (p, schedule) in &out {
        let mut chain = vec![schedule.id.as_str()];
        let mut at = schedule.id.as_str();
        while let Some(next) = waits.get(at) {
            if *next == schedule.id && chain.len() > 1 {
                let cycle: BTreeSet<&str> = chain.iter().copied().collect();
                if reported.insert(cycle) {
                    chain.push(next);
                    ctx.error(
                        &p.key("after_schedule_id"),
                        format!(
                            "the schedules wait for each other in a circle: {}",
                            chain.join(" -> ")
                        ),
                    );
                }
                break;
            }
            if chain.contains(next) || chain.len() > out.len() {
                break;
            }
            chain.push(next);
            at = next;
        }
    }
    if !inert.is_empty() {
        let names: Vec<String> = inert.iter().map(|k: &&str| quote(k)).collect();
        ctx.warning(
            &path,
            format!(
                "read as the original writes them, with no effect in Trellis: {}",
                names.join(", ")
            ),
        );
    }
    out.into_iter().map(|(_, s)| s).collect()
}

fn read_one(
    ctx: &mut Ctx,
    value: &Value,
    path: JsonPath,
    inert: &mut BTreeSet<&'static str>,
) -> Option<Schedule> {
    let mut o = Obj::new(ctx, value, path.clone(), "a schedule")?;
    let id = o.req_str(ctx, "id", "the schedule id");
    if let Some(id) = &id {
        check_plain_id(ctx, &path.key("id"), "schedule id", id);
    }
    let name = o.str(ctx, "name");
    let description = o.str(ctx, "description");
    let kind = o
        .one_of(
            ctx,
            "schedule_type",
            &[("cron", false), ("calendar", true), ("", false)],
        )
        .unwrap_or(false);
    let cron_expression = o.str(ctx, "cron_expression");
    let items = o.list(ctx, "calendar_items", calendar_item);
    let when = if kind {
        let items = items.unwrap_or_default();
        if items.is_empty() {
            ctx.error(
                &path.key("calendar_items"),
                "a calendar schedule needs calendar_items: [{\"id\", \"date\": \"YYYY-MM-DD\", \"time\": \"HH:MM\"}]",
            );
        }
        if items.len() > MAX_CALENDAR_ITEMS {
            ctx.error(
                &path.key("calendar_items"),
                format!(
                    "{} calendar items, more than the {MAX_CALENDAR_ITEMS} a schedule may have",
                    items.len()
                ),
            );
        }
        When::Calendar {
            calendar_items: items,
        }
    } else {
        match cron_expression {
            Some(expr) => {
                check_cron(ctx, &path.key("cron_expression"), &expr);
                When::Cron {
                    cron_expression: expr,
                }
            }
            None => {
                ctx.error(
                    &path.key("cron_expression"),
                    "a cron schedule needs cron_expression: five fields, minute hour day month \
                     weekday (\"0 9 * * 1-5\")",
                );
                When::Cron {
                    cron_expression: String::new(),
                }
            }
        }
    };
    let timezone = o.str(ctx, "timezone").filter(|t| !t.trim().is_empty());
    if let Some(tz) = &timezone
        && Tz::from_str(tz).is_err()
    {
        let hint = hint(did_you_mean(
            tz,
            chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()),
        ));
        ctx.error(
            &path.key("timezone"),
            format!(
                "unknown time zone {}: expected an IANA name such as \"Europe/Paris\"{hint}",
                quote(tz)
            ),
        );
    }
    let enabled = o.bool(ctx, "enabled").unwrap_or(false);
    o.accept(&["trigger_payload", "created_at", "updated_at"]);
    // Checked against the groups once the variables file is merged in: [`check_groups`].
    let group_names = o.str_list(ctx, "group_names").unwrap_or_default();
    let mut route_selections = BTreeMap::new();
    if let Some(routes) = o.object(ctx, "route_selections") {
        for (step, route) in routes {
            match route {
                Value::String(r) => {
                    route_selections.insert(step, r);
                }
                other => ctx.error(
                    &path.key("route_selections").key(&step),
                    format!("expected a route id (a string), found {}", kind_of(&other)),
                ),
            }
        }
    }
    // `workflow` is the original's legacy name of its one mode.
    o.one_of(ctx, "mode", &[("workshop", ()), ("workflow", ()), ("", ())]);
    let messages = o.str_list(ctx, "messages").unwrap_or_default();
    check_messages(ctx, &path, &messages);
    let collision_policy = o
        .one_of(
            ctx,
            "collision_policy",
            &[
                ("skip", CollisionPolicy::Skip),
                ("queue_latest", CollisionPolicy::QueueLatest),
                ("retry", CollisionPolicy::Retry),
                ("coalesce", CollisionPolicy::Coalesce),
                ("", CollisionPolicy::Skip),
            ],
        )
        .unwrap_or_default();
    let max_start_delay_minutes = minutes(ctx, &mut o, &path, "max_start_delay_minutes");
    let after_schedule_id = o.str(ctx, "after_schedule_id").filter(|s| !s.is_empty());
    let after_status = o.one_of(
        ctx,
        "after_terminal_status",
        &[
            ("completed", AfterStatus::Completed),
            ("any_terminal", AfterStatus::AnyTerminal),
            ("", AfterStatus::Completed),
        ],
    );
    let after_delay = minutes(ctx, &mut o, &path, "after_delay_minutes");
    let deadline = o.str(ctx, "dependency_deadline").filter(|s| !s.is_empty());
    let deadline = deadline.and_then(|d| clock_field(ctx, &path.key("dependency_deadline"), &d));
    let after = match after_schedule_id {
        Some(schedule_id) => Some(After {
            schedule_id,
            status: after_status.unwrap_or_default(),
            delay_minutes: after_delay.unwrap_or(0),
            deadline,
        }),
        None => {
            for (key, set) in [
                ("after_terminal_status", after_status.is_some()),
                ("after_delay_minutes", after_delay.is_some_and(|d| d > 0)),
                ("dependency_deadline", deadline.is_some()),
            ] {
                if set {
                    ctx.error(
                        &path.key(key),
                        format!("{key} is only for a schedule that waits for another (after_schedule_id)"),
                    );
                }
            }
            None
        }
    };
    for key in INERT_KEYS {
        if o.has(key) {
            inert.insert(key);
        }
    }
    o.accept(INERT_KEYS);
    o.finish(ctx);
    Some(Schedule {
        id: id?,
        name,
        description,
        when,
        timezone: timezone.unwrap_or_else(|| "UTC".to_string()),
        enabled,
        group_names,
        route_selections,
        messages,
        collision_policy,
        max_start_delay_minutes,
        after,
    })
}

/// The most minutes a delay of a schedule may be: a year (of 366 days).
pub const MAX_DELAY_MINUTES: u64 = 366 * 24 * 60;

/// A delay in minutes, at most [`MAX_DELAY_MINUTES`].
fn minutes(ctx: &mut Ctx, o: &mut Obj, path: &JsonPath, key: &'static str) -> Option<u64> {
    let value = o.u64(ctx, key)?;
    if value > MAX_DELAY_MINUTES {
        ctx.error(
            &path.key(key),
            format!("{key} is {value}: at most {MAX_DELAY_MINUTES} (a year) is accepted"),
        );
        return None;
    }
    Some(value)
}

/// Checks each schedule's `group_names` against the workflow's groups (those of
/// `workflow.json` and of the variables file): every name a group's id or name, and a
/// workflow with groups needs them named. The diagnostics name `workflow.json`.
pub fn check_groups(
    manifest: &crate::manifest::WorkflowManifest,
) -> crate::diagnostics::Diagnostics {
    let mut diags = crate::diagnostics::Diagnostics::new();
    let mut ctx = Ctx::new(crate::WORKFLOW_FILE, &mut diags);
    let groups = &manifest.groups;
    let written = manifest.kept.get("schedules").and_then(Value::as_array);
    for schedule in &manifest.original.schedules {
        let index = written
            .and_then(|all| {
                all.iter()
                    .position(|s| s.get("id").and_then(Value::as_str) == Some(&schedule.id))
            })
            .unwrap_or(0);
        let path = JsonPath::root().key("schedules").index(index);
        let names: Vec<&str> = groups
            .iter()
            .map(|g| g.name.as_deref().unwrap_or(&g.id))
            .collect();
        for (i, g) in schedule.group_names.iter().enumerate() {
            let known = groups
                .iter()
                .any(|x| x.id == *g || x.name.as_deref() == Some(g.as_str()));
            if known {
                continue;
            }
            let hint = hint(did_you_mean(g, names.iter().copied()));
            ctx.error(
                &path.key("group_names").index(i),
                format!(
                    "no group {} in the workflow{hint} (its groups: {})",
                    quote(g),
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            );
        }
        if schedule.group_names.is_empty() && !groups.is_empty() {
            ctx.error(
                &path.key("group_names"),
                "a schedule of a workflow with groups names the groups it runs (group_names)",
            );
        }
    }
    diags
}

fn calendar_item(ctx: &mut Ctx, value: &Value, path: JsonPath) -> Option<CalendarItem> {
    let mut o = Obj::new(ctx, value, path.clone(), "a calendar item")?;
    let id = o.req_str(ctx, "id", "the item id");
    let date = o.req_str(ctx, "date", "its date, YYYY-MM-DD");
    let time = o.req_str(ctx, "time", "its time, HH:MM");
    let description = o.str(ctx, "description");
    let messages = o.str_list(ctx, "messages").unwrap_or_default();
    check_messages(ctx, &path, &messages);
    o.accept(&["trigger_payload"]);
    o.finish(ctx);
    let date = date.and_then(|d| {
        let parsed = NaiveDate::parse_from_str(&d, "%Y-%m-%d").ok();
        if parsed.is_none() {
            ctx.error(
                &path.key("date"),
                format!("expected a date \"YYYY-MM-DD\", found {}", quote(&d)),
            );
        }
        parsed
    });
    let time = time.and_then(|t| clock_field(ctx, &path.key("time"), &t));
    Some(CalendarItem {
        id: id?,
        date: date?,
        time: time?,
        description,
        messages,
    })
}

/// `text` read as a local time `HH:MM` (24 hours); an error at `path` when it is not one.
fn clock_field(ctx: &mut Ctx, path: &JsonPath, text: &str) -> Option<NaiveTime> {
    let parsed = NaiveTime::parse_from_str(text.trim(), "%H:%M").ok();
    if parsed.is_none() {
        ctx.error(
            path,
            format!("expected a local time \"HH:MM\", found {}", quote(text)),
        );
    }
    parsed
}

/// An error when a firing would send more than [`MAX_MESSAGES`] messages.
fn check_messages(ctx: &mut Ctx, path: &JsonPath, messages: &[String]) {
    if messages.len() > MAX_MESSAGES {
        ctx.error(
            &path.key("messages"),
            format!(
                "{} messages, more than the {MAX_MESSAGES} a firing sends (each is a turn)",
                messages.len()
            ),
        );
    }
}

/// ` (did you mean "X"?)` for a close name, else nothing.
fn hint(close: Option<&str>) -> String {
    close
        .map(|c| format!(" (did you mean \"{c}\"?)"))
        .unwrap_or_default()
}

/// Reports a cron expression that is not five fields croner reads.
fn check_cron(ctx: &mut Ctx, path: &JsonPath, expr: &str) {
    let fields = expr.split_whitespace().count();
    if fields != 5 {
        ctx.error(
            path,
            format!(
                "{} has {fields} fields: expected five, minute hour day month weekday \
                 (\"*/15 * * * *\")",
                quote(expr)
            ),
        );
        return;
    }
    match croner::Cron::from_str(expr) {
        Err(e) => ctx.error(
            path,
            format!("{} is not a cron expression: {e}", quote(expr)),
        ),
        Ok(cron) if !ever_fires(&cron) => ctx.error(
            path,
            format!(
                "{} never fires: no date has its day of the month in its month (\"0 9 31 2 *\" \
                 asks for February 31)",
                quote(expr)
            ),
        ),
        Ok(_) => {}
    }
}

/// Years in which a cron must have a day, at least one: every weekday falls on every date of
/// the calendar (leap days too) in 28 years.
const CRON_CYCLE_YEARS: i32 = 28;

/// Whether some day of the 28-year calendar cycle matches `cron`'s day, month and weekday
/// fields. A cron that matches none would be searched for, in vain, up to the year 5000 at
/// each evaluation: refused instead.
fn ever_fires(cron: &croner::Cron) -> bool {
    let Some(mut day) = chrono::NaiveDate::from_ymd_opt(2028, 1, 1) else {
        return true;
    };
    let end = 2028 + CRON_CYCLE_YEARS;
    while day.year() < end {
        let (y, m, d) = (day.year(), day.month(), day.day());
        if cron.pattern.month_match(m).unwrap_or(true)
            && cron.pattern.day_match(y, m, d).unwrap_or(true)
        {
            return true;
        }
        let Some(next) = day.succ_opt() else {
            return true;
        };
        day = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::Diagnostics;
    use crate::manifest::Group;

    #[test]
    fn group_names_are_checked_against_the_workflows_groups() {
        let text = serde_json::json!({
            "groups": [{"id": "us", "name": "US market"}],
            "schedules": [
                {"id": "a", "cron_expression": "0 9 * * *", "group_names": ["US markt", "us"]},
                {"id": "b", "cron_expression": "0 9 * * *"}
            ]
        });
        let (manifest, _) =
            crate::manifest::parse_manifest(&text.to_string(), "workflow.json").expect("it parses");
        let lines = check_groups(&manifest).lines();
        assert_eq!(
            lines,
            [
                "workflow.json: schedules[0].group_names[0]: no group \"US markt\" in the workflow (did you mean \"US market\"?) (its groups: US market)",
                "workflow.json: schedules[1].group_names: a schedule of a workflow with groups names the groups it runs (group_names)",
            ]
        );
    }

    fn read(schedules: Value, _groups: &[Group]) -> (Vec<Schedule>, Vec<String>) {
        let mut diags = Diagnostics::new();
        let mut ctx = Ctx::new("workflow.json", &mut diags);
        let out = read_schedules(&mut ctx, &schedules);
        (out, diags.lines())
    }

    fn cron(expr: &str, tz: &str) -> Schedule {
        let (mut s, problems) = read(
            serde_json::json!([{"id": "s", "cron_expression": expr, "timezone": tz,
                                "enabled": true}]),
            &[],
        );
        assert!(problems.is_empty(), "{problems:?}");
        s.remove(0)
    }

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    /// A cron that can never match was searched for up to the year 5000 at each
    /// evaluation: 45 ms each, 100 of them froze `trellis serve` (round 10). It is refused;
    /// one that matches seldom (a leap day, a weekday) is not.
    #[test]
    fn a_cron_that_never_fires_is_refused() {
        for never in ["0 9 31 2 *", "0 9 30 2 *", "0 0 31 4,6,9,11 *"] {
            let (_, problems) = read(
                serde_json::json!([{"id": "n", "cron_expression": never}]),
                &[],
            );
            assert!(
                problems.iter().any(|p| p.contains("never fires")),
                "{never}: {problems:?}"
            );
        }
        for seldom in ["0 9 29 2 *", "0 9 31 2 1", "0 9 L 2 *", "0 0 31 * *"] {
            let (_, problems) = read(
                serde_json::json!([{"id": "s", "cron_expression": seldom}]),
                &[],
            );
            assert!(problems.is_empty(), "{seldom}: {problems:?}");
        }
    }

    /// 100 schedules of 1,000 calendar items each (a valid 15 MB `workflow.json`) made the
    /// server hold 1.15 GB serving its scheduler (round 30): 10,000 in all.
    #[test]
    fn the_calendar_items_of_all_schedules_are_bounded_together() {
        let schedules = |n: usize, each: usize| {
            let items: Vec<Value> = (0..each)
                .map(|i| serde_json::json!({"id": format!("i{i}"), "date": "2030-01-01", "time": "09:00"}))
                .collect();
            Value::Array(
                (0..n)
                    .map(|i| {
                        serde_json::json!({"id": format!("s{i}"), "schedule_type": "calendar",
                                                "calendar_items": items})
                    })
                    .collect(),
            )
        };
        let (read_in, problems) = read(schedules(10, 1000), &[]);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(read_in.len(), 10);
        let (read_in, problems) = read(schedules(11, 1000), &[]);
        assert!(read_in.is_empty());
        assert_eq!(
            problems,
            [
                "workflow.json: schedules: 11000 calendar items in all, more than the 10000 the \
              schedules of a workflow may have together"
            ]
        );
    }

    #[test]
    fn every_problem_is_named_with_its_path() {
        let groups = [Group {
            id: "us".into(),
            name: Some("US market".into()),
            variables: BTreeMap::new(),
        }];
        let (_, problems) = read(
            serde_json::json!([
                {"id": "a", "cron_expression": "61 * * * *", "timezone": "Europe/Pariss",
                 "group_names": ["usa"], "collision_policy": "queue-latest"},
                {"id": "b", "cron_expression": "* * * *", "group_names": ["US market"],
                 "after_delay_minutes": 5, "enabld": true},
                {"id": "c", "schedule_type": "calendar", "group_names": ["us"],
                 "calendar_items": [{"id": "i", "date": "2026-13-01", "time": "25:00"}],
                 "after_schedule_id": "d"},
                {"id": "d", "cron_expression": "0 9 * * *", "group_names": ["us"],
                 "after_schedule_id": "c", "dependency_deadline": "noon"},
                {"id": "e", "cron_expression": "0 9 * * *", "after_schedule_id": "e",
                 "messages": vec!["go"; 51]}
            ]),
            &groups,
        );
        let expect = [
            "schedules[0].cron_expression: \"61 * * * *\" is not a cron expression",
            "schedules[0].timezone: unknown time zone \"Europe/Pariss\": expected an IANA name such as \"Europe/Paris\" (did you mean \"Europe/Paris\"?)",
            "schedules[0].collision_policy: expected one of",
            "schedules[1].cron_expression: \"* * * *\" has 4 fields",
            "schedules[1].after_delay_minutes: after_delay_minutes is only for a schedule that waits for another",
            "schedules[1]: unknown key \"enabld\" (did you mean \"enabled\"?)",
            "schedules[2].calendar_items[0].date: expected a date \"YYYY-MM-DD\", found \"2026-13-01\"",
            "schedules[2].calendar_items[0].time: expected a local time \"HH:MM\", found \"25:00\"",
            "schedules[3].dependency_deadline: expected a local time \"HH:MM\", found \"noon\"",
            "schedules[4].after_schedule_id: a schedule cannot wait for itself",
            "schedules[4].messages: 51 messages, more than the 50 a firing sends",
            "schedules[2].after_schedule_id: the schedules wait for each other in a circle: c -> d -> c",
        ];
        for e in expect {
            assert!(
                problems.iter().any(|p| p.contains(e)),
                "{e:?} in {problems:#?}"
            );
        }
    }

    #[test]
    fn a_date_the_zone_skipped_fires_at_the_first_minute_after_it_quickly() {
        // Samoa skipped 2011-12-30 whole.
        let tz: Tz = "Pacific/Apia".parse().unwrap();
        let day = NaiveDate::from_ymd_opt(2011, 12, 30).unwrap();
        let at = local_instant(&tz, day, NaiveTime::from_hms_opt(12, 0, 0).unwrap()).unwrap();
        let local = at.with_timezone(&tz);
        assert_eq!(
            local.date_naive(),
            NaiveDate::from_ymd_opt(2011, 12, 31).unwrap()
        );
        assert_eq!(local.time(), NaiveTime::MIN);
    }

    #[test]
    fn cron_occurrences_are_in_the_schedules_zone() {
        let s = cron("30 9 * * 1-5", "Europe/Paris");
        // Friday 2026-12-04 10:00 in Paris is 09:00 UTC: the next is Monday 09:30 Paris.
        let next = s.next_after(utc("2026-12-04T09:00:00.25Z")).unwrap();
        assert_eq!(next, utc("2026-12-07T08:30:00Z"), "a whole minute");
        let few = s.occurrences(utc("2026-12-07T00:00:00Z"), utc("2026-12-09T23:00:00Z"), 10);
        assert_eq!(few.len(), 3);
    }

    #[test]
    fn a_spring_forward_gap_fires_after_it_and_a_fall_back_hour_fires_once() {
        // Europe/Paris skips 02:00-03:00 on 2026-03-29 and repeats 02:00-03:00 on
        // 2026-10-25.
        let s = cron("30 2 * * *", "Europe/Paris");
        let spring = s.next_after(utc("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(
            spring,
            utc("2026-03-29T01:00:00Z"),
            "03:00 CEST, after the gap"
        );
        let fall: Vec<_> =
            s.occurrences(utc("2026-10-24T12:00:00Z"), utc("2026-10-25T12:00:00Z"), 5);
        assert_eq!(fall, [utc("2026-10-25T00:30:00Z")], "02:30 CEST, once");
        let (mut cal, problems) = read(
            serde_json::json!([{"id": "c", "schedule_type": "calendar",
                "timezone": "Europe/Paris", "calendar_items": [
                    {"id": "gap", "date": "2026-03-29", "time": "02:30"},
                    {"id": "twice", "date": "2026-10-25", "time": "02:30"}]}]),
            &[],
        );
        assert!(problems.is_empty(), "{problems:?}");
        let cal = cal.remove(0);
        let all = cal.occurrences(utc("2026-01-01T00:00:00Z"), utc("2026-12-31T00:00:00Z"), 5);
        assert_eq!(
            all,
            [utc("2026-03-29T01:00:00Z"), utc("2026-10-25T00:30:00Z")]
        );
        assert_eq!(cal.calendar_item_at(all[1]).unwrap().id, "twice");
    }
}
