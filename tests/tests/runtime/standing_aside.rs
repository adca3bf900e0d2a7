//! Candidates standing aside (`Election::stand_aside`) where things meet: a stand-aside attempt
//! that reaches the store late, a term handed over in the moment a candidate stands aside, a
//! hand-over naming one, a shutdown, and a line of many places standing aside with lapsed ones
//! among them. What every store does is the conformance suite's
//! (`a_candidate_standing_aside_is_passed_over_until_it_rejoins`).

use std::time::Duration;

use lock_runtime::{Election, Leadership, LockError, Registry};
use lock_tests::proxy::Proxy;
use lock_tests::{with_timeouts, RedisServer};

use super::support::{eventually, registry};

/// Bounds every wait for an event.
const LIMIT: Duration = Duration::from_secs(20);

async fn in_line(election: &Election, n: usize) {
    eventually(LIMIT, "the candidates queued", || async {
        election.in_line().await.expect("the line").len() == n
    })
    .await;
}

type Campaign = tokio::task::JoinHandle<Result<Leadership, LockError>>;

/// The line of election `rota`: `a` leads (its election and term), then `b` and `c` queue, in
/// that order, each in a task of its own.
async fn a_line(
    a: &Registry,
    b: &Registry,
    c: &Registry,
) -> (Election, Leadership, Campaign, Campaign) {
    let first = a.election("rota").identity("a").ttl(LIMIT);
    let leading = first.campaign().await.expect("elected alone");
    let second = tokio::spawn(b.election("rota").identity("b").ttl(LIMIT).campaign());
    in_line(&first, 1).await;
    let third = tokio::spawn(c.election("rota").identity("c").ttl(LIMIT).campaign());
    in_line(&first, 2).await;
    (first, leading, second, third)
}

/// The term `campaign` wins within [`LIMIT`].
async fn elected(campaign: Campaign, who: &str) -> Leadership {
    tokio::time::timeout(LIMIT, campaign)
        .await
        .unwrap_or_else(|_| panic!("{who} is elected within {LIMIT:?}"))
        .expect("task")
        .expect("elected")
}

/// A stand-aside attempt that reaches the store late (held up on the network, its answer given
/// up on), once its candidate has rejoined and leads with the same token, keeps the term: it
/// finds its own token and ends nothing. Sent here by hand, as `ACQUIRE_LUA` with `ARGV[10]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_stand_aside_attempt_never_ends_the_term_its_candidate_leads() {
    let server = RedisServer::start();
    let (a, b, c) = (registry(&server), registry(&server), registry(&server));
    let (first, leading, second, third) = a_line(&a, &b, &c).await;
    leading.resign().await.expect("resign");
    let second = elected(second, "b").await;
    let token = a
        .inspect("rota")
        .await
        .expect("inspect")
        .owner
        .expect("b leads");

    let mut con = lock_tests::direct::raw(&server.url()).await;
    let reply: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(lock_runtime::protocol::ACQUIRE_LUA)
        .arg(4)
        .arg(
            &[
                "lock:rota",
                "fence:{lock:rota}",
                "queue:{lock:rota}",
                "queued:{lock:rota}",
            ][..],
        )
        .arg(&token)
        .arg(LIMIT.as_millis().to_string())
        .arg(&["1", "1", "PUBLISH", "0", "1", "1", "0", "1"][..])
        .query_async(&mut con)
        .await
        .expect("the late attempt");
    assert_eq!(
        reply.first(),
        Some(&redis::Value::Int(1)),
        "{reply:?}: its own token"
    );
    let info = a.inspect("rota").await.expect("inspect");
    assert_eq!(info.owner.as_deref(), Some(token.as_str()), "b still leads");
    assert!(!second.is_lost() && !third.is_finished(), "one leader");
    assert_eq!(first.in_line().await.expect("the line"), ["c"]);
    assert!(first.standing_aside().await.expect("the line").is_empty());
    second.resign().await.expect("resign");
    let third = elected(third, "c").await;
    third.resign().await.expect("resign");
}

/// A registry shut down while its candidate stands aside: the campaign ends (ShutDown), and
/// its place leaves the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_campaign_standing_aside_and_its_place() {
    let server = RedisServer::start();
    let (a, b) = (registry(&server), registry(&server));
    let first = a.election("rota").identity("a").ttl(LIMIT);
    let leading = first.campaign().await.expect("elected alone");
    // A place that would not lapse within the test: it must be taken out.
    let draining = b.election("rota").identity("b").ttl(LIMIT * 3);
    let second = tokio::spawn(draining.campaign());
    in_line(&first, 1).await;
    draining.stand_aside();
    eventually(LIMIT, "b stands aside", || async {
        first.standing_aside().await.expect("line") == ["b"]
    })
    .await;
    b.shutdown().await;
    let ended = tokio::time::timeout(LIMIT, second)
        .await
        .expect("the campaign ends at the shutdown")
        .expect("task");
    assert!(
        matches!(ended, Err(LockError::ShutDown { .. })),
        "{ended:?}"
    );
    eventually(LIMIT, "its place leaves the line", || async {
        first.standing_aside().await.expect("line").is_empty()
    })
    .await;
    leading.resign().await.expect("resign");
}

/// A hand-over naming a candidate standing aside is refused (`NotInLine`), nothing changes,
/// and the next handoff passes it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_naming_a_candidate_standing_aside_is_refused() {
    let server = RedisServer::start();
    let (a, b, c) = (registry(&server), registry(&server), registry(&server));
    let (first, leading, second, third) = a_line(&a, &b, &c).await;
    let draining = b.election("rota").identity("b");
    draining.stand_aside();
    eventually(LIMIT, "b stands aside", || async {
        first.standing_aside().await.expect("line") == ["b"]
    })
    .await;
    let refused = first.hand_over("b", LIMIT).await;
    assert!(
        matches!(refused, Err(LockError::NotInLine { .. })),
        "{refused:?}"
    );
    assert!(first.is_leader());
    leading.resign().await.expect("resign");
    let third = elected(third, "c").await;
    assert!(!second.is_finished());
    third.resign().await.expect("resign");
    second.abort();
}

/// Many places standing aside, lapsed places among them (candidates cut off from the store:
/// their places lapse), then one ready candidate last: the release goes to the ready one, none
/// of the aside ones, and the aside ones keep their order; one that rejoins is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_aside_places_with_lapsed_ones_among_them_pass_the_term_to_the_last_ready_one() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let leader_reg = registry(&server);
    let first = leader_reg.election("rota").identity("l").ttl(LIMIT);
    let leading = first.campaign().await.expect("elected alone");
    let queued = || async {
        leader_reg
            .inspect("rota")
            .await
            .expect("inspect")
            .queue
            .len()
    };
    let mut aside = Vec::new();
    let mut cut = Vec::new();
    for i in 0..6 {
        let name = format!("s{i}");
        let reg = if i % 2 == 0 {
            registry(&server)
        } else {
            with_timeouts(Registry::builder().url(proxy.url()), Duration::from_secs(1))
        };
        let e = reg
            .election("rota")
            .identity(name.clone())
            .ttl(Duration::from_secs(3));
        let task = tokio::spawn(e.campaign());
        eventually(LIMIT, "queued", || async { queued().await == i + 1 }).await;
        if i % 2 == 0 {
            e.stand_aside();
            eventually(LIMIT, "aside", || async {
                first.standing_aside().await.expect("line").len() == i / 2 + 1
            })
            .await;
            aside.push((reg, e, task, name));
        } else {
            cut.push((reg, task));
        }
    }
    // The odd ones are cut off: their places lapse.
    proxy.blackhole();
    eventually(LIMIT, "the cut-off places lapsed", || async {
        queued().await == 3
    })
    .await;
    let last_reg = registry(&server);
    let last = tokio::spawn(
        last_reg
            .election("rota")
            .identity("z")
            .ttl(LIMIT)
            .campaign(),
    );
    eventually(LIMIT, "z in line", || async {
        first.in_line().await.expect("line") == ["z"]
    })
    .await;
    leading.resign().await.expect("resign");
    let z = elected(last, "z").await;
    for (_, _, task, name) in &aside {
        assert!(!task.is_finished(), "{name} elected standing aside");
    }
    assert_eq!(
        first.standing_aside().await.expect("line"),
        ["s0", "s2", "s4"],
        "the aside places keep their order"
    );
    z.resign().await.expect("resign");
    assert_eq!(
        first.leader().await.expect("look"),
        None,
        "a free term stays free"
    );
    aside[1].1.rejoin();
    let (_, _, task, _) = aside.remove(1);
    let s2 = elected(task, "s2").await;
    assert_eq!(s2.identity(), "s2");
    s2.resign().await.expect("resign");
    for (_, _, task, _) in aside {
        task.abort();
    }
    for (_, task) in cut {
        task.abort();
    }
}

/// A term handed to a candidate in the moment it stands aside, before its campaign could tell
/// the store, goes on to the next candidate: its work never starts, and it keeps its place.
/// (On one thread, the release runs before the candidate's task does.)
#[tokio::test(flavor = "current_thread")]
async fn a_term_handed_to_a_candidate_as_it_stands_aside_goes_on_to_the_next() {
    let registry = Registry::in_memory();
    let (_, leading, second, third) = a_line(&registry, &registry, &registry).await;
    let b = registry.election("rota").identity("b");

    b.stand_aside();
    // Handed to b in the store: b's place is not yet marked.
    leading.resign().await.expect("resign");
    let third = elected(third, "c").await;
    assert!(!second.is_finished(), "b is not elected standing aside");
    assert_eq!(b.standing_aside().await.expect("the line"), ["b"]);
    third.resign().await.expect("resign");
    b.rejoin();
    let second = elected(second, "b").await;
    assert_eq!(second.identity(), "b");
}
