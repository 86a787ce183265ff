//! `db/seed.sql`: a workspace may ship SQL instead of a binary database.

use super::*;

/// How long `db/seed.sql` may run.
const SEED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Creates `db/db.sqlite` from `db/seed.sql` when the database is missing (or an empty file
/// with no write-ahead log beside it: what opening a database that was not there leaves, and
/// no data) and the seed exists: a workspace may ship SQL instead of a binary database.
/// Returns whether it did. `trellis run` and `trellis script` call it before anything opens
/// the database. The database the seed makes is written out of `writes`, the run's write
/// budget (a seed inserting blobs made a 300 MB database under an 8 MiB budget).
pub fn seed_database(
    fs: &WorkspaceFs,
    writes: &trellis_sandbox::capabilities::DbWriteBudget,
) -> Result<bool> {
    // A link or a FIFO at either path is refused, not followed (see `store::workspace_fs`).
    match fs.kind(DB_FILE)? {
        None => {}
        // A read capped at 0 bytes succeeds only on an empty file.
        Some(Kind::File)
            if fs.read_capped(DB_FILE, 0).is_ok()
                && fs.kind(format!("{DB_FILE}-wal"))?.is_none() => {}
        Some(Kind::File) => return Ok(false),
        Some(Kind::Link) => bail!("{}", link_error(Path::new(DB_FILE))),
        Some(_) => bail!("{DB_FILE} is not a regular file"),
    }
    if fs.kind(SEED_SQL)?.is_none() {
        return Ok(false);
    }
    let sql = fs
        .read_to_string(SEED_SQL)
        .with_context(|| format!("reading {SEED_SQL}"))?;
    let tmp = "db/.db.sqlite.seeding";
    fs.remove_file(tmp)
        .with_context(|| format!("clearing {tmp}"))?;
    let tmp_host = fs
        .ensure_regular_file(tmp)
        .with_context(|| format!("creating {tmp}"))?;
    // The seed is the workspace's SQL: fenced like a plan's (no ATTACH, a deadline).
    let db = sql::open_with_growth(
        &tmp_host,
        SqlAccess::ReadWrite,
        SEED_TIMEOUT,
        writes.bytes_left().min(sql::DEFAULT_MAX_GROWTH_BYTES),
    )
    .with_context(|| format!("creating {tmp}"))?;
    let seeded = sql::refuse_unseen(&sql)
        .map_err(anyhow::Error::msg)
        .and_then(|()| {
            db.conn().execute_batch(&sql).map_err(|e| {
                let described = anyhow::anyhow!(db.describe(&e));
                // Full: the database reached what the budget lets it grow by, which is named.
                if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
                    described.context(format!(
                        "the database it makes would take more than the {} bytes left of the \
                         run's write budget (--max-run-write-mib) or the workspace's quota \
                         (--max-workspace-mib)",
                        writes.bytes_left()
                    ))
                } else {
                    described
                }
            })
        });
    drop(db);
    if let Err(err) = seeded {
        let _ = fs.remove_file(tmp);
        return Err(err.context(format!("running {SEED_SQL}")));
    }
    writes.charge(fs.metadata_len(tmp).unwrap_or(0));
    fs.rename(tmp, DB_FILE)
        .with_context(|| format!("creating {DB_FILE}"))?;
    Ok(true)
}
