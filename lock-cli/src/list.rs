//! `lockctl list`: the held locks under a key prefix, one row each.

use futures_util::StreamExt;
use lock_runtime::Registry;

use crate::scan::{self, Found};
use crate::target::Target;
use crate::{render, Failure};

const INSPECT_AT_ONCE: usize = 32;

/// Lists the locks whose key starts with `key_prefix`: the keys come from a scan of every node,
/// their state from `Registry::inspect` (so Redlock rows show the majority's owner).
///
/// # Errors
/// When no node could be scanned.
pub async fn list(target: &Target, registry: &Registry, key_prefix: &str) -> Result<(), Failure> {
    let under = registry.redis_key(key_prefix);
    let scan = scan::scan(target, &under).await?;
    for failed in &scan.failed {
        eprintln!("warning: could not scan {failed}");
    }
    let redlock = matches!(target, Target::Redlock(_));
    let mut header = vec!["KEY", "OWNER", "TTL", "FENCE", "QUEUE"];
    if redlock {
        header.push("NODES");
    }
    let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
    // A few inspections in flight at once: thousands of locks would otherwise cost thousands
    // of sequential round trips; a few dozen keep the server's load negligible.
    let nodes = redlock.then(|| target.urls().len());
    let mut found = futures_util::stream::iter(&scan.keys)
        .map(|found| row(registry, found, nodes))
        .buffered(INSPECT_AT_ONCE);
    while let Some(found) = found.next().await {
        rows.extend(found);
    }
    let held = rows.len() - 1;
    if held == 0 {
        println!("no locks under {under}");
        return Ok(());
    }
    print!("{}", render::table(&rows));
    let nodes = match target {
        Target::Redlock(urls) => format!(" on {} of {} nodes", scan.scanned, urls.len()),
        Target::Cluster(_) => format!(" on {} masters", scan.scanned),
        Target::Sentinel { .. } => format!(
            " on {}, the master the sentinels name",
            scan.master.as_deref().unwrap_or("?")
        ),
        _ => String::new(),
    };
    println!(
        "{held} lock{} under {under}{nodes}",
        if held == 1 { "" } else { "s" }
    );
    Ok(())
}

/// One row, or `None` for a lock released since the scan saw it. `redlock_nodes` is the node
/// count in Redlock mode, where a key on a minority of nodes is shown as not held.
async fn row(
    registry: &Registry,
    found: &Found,
    redlock_nodes: Option<usize>,
) -> Option<Vec<String>> {
    let prefix = registry.prefix();
    let key = found
        .redis_key
        .strip_prefix(prefix)
        .unwrap_or(&found.redis_key);
    let mut row = vec![key.to_owned()];
    match registry.inspect(key).await {
        Ok(info) if render::holder(&info).is_none() && redlock_nodes.is_none() => return None,
        Ok(info) => {
            let owner = render::holder(&info).unwrap_or_else(|| "(no majority)".to_owned());
            row.extend([
                owner,
                render::remaining(&info),
                render::fence(&info),
                info.waiters.to_string(),
            ]);
        }
        // Something else under the prefix (not a string, a stray brace in a cluster): show it
        // rather than hide it.
        Err(e) => row.extend([
            format!("error: {e}"),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
        ]),
    }
    if let Some(total) = redlock_nodes {
        row.push(format!("{}/{total}", found.nodes));
    }
    Some(row)
}
