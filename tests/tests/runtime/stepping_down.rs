//! A leader stepping down on purpose (`Election::step_down`, `hand_over`), where calls meet:
//! two calls for one term, a term lost or resigned during the grace, a caller that stops
//! waiting, and a step-down asked from inside the term's own work. What every store does with a
//! step-down is the conformance suite's (`a_leader_steps_down_and_hands_over_to_a_named_candidate`).

use std::time::Duration;

use lock_runtime::{Election, LockError, LostReason, Registry};

use super::support::eventually;

/// Bounds every wait for an event.
const LIMIT: Duration = Duration::from_secs(20);

/// Until `n` candidates wait in `election`'s line.
async fn in_line(election: &Election, n: usize) {
    eventually(LIMIT, "the candidates queued", || async {
        election.in_line().await.expect("the line").len() == n
    })
    .await;
}

/// Steps `a` down in a task of its own, and returns once the step-down has asked the work.
async fn stepping_down(a: &Election) -> tokio::task::JoinHandle<StepDown> {
    let stepping = tokio::spawn({
        let a = a.clone();
        async move { a.step_down(LIMIT).await }
    });
    eventually(LIMIT, "the step-down asked", || async {
        a.term().is_some_and(|term| term.is_stepping_down())
    })
    .await;
    stepping
}

type StepDown = Result<Option<lock_runtime::SteppedDown>, LockError>;

/// A candidate for `key` on `registry`, campaigning in a task of its own.
fn campaign(
    registry: &Registry,
    key: &str,
    identity: &str,
) -> tokio::task::JoinHandle<Result<lock_runtime::Leadership, LockError>> {
    tokio::spawn(
        registry
            .election(key)
            .identity(identity)
            .ttl(LIMIT)
            .campaign(),
    )
}

/// Two hand-overs of one term, naming b then c: the term goes to b, the name given first, and
/// only the hand-over that named b says it went to its successor. On the paused clock, where a
/// sleep returns once every other task is parked: both calls are in when the work finishes.
#[tokio::test(start_paused = true)]
async fn of_two_hand_overs_only_the_one_whose_successor_leads_says_so() {
    let registry = Registry::in_memory();
    let a = registry.election("rota").identity("a").ttl(LIMIT);
    let (asked_tx, asked) = tokio::sync::oneshot::channel();
    let work = tokio::spawn(a.campaign().await.expect("elected alone").run(async move {
        lock_runtime::current()
            .expect("leading")
            .stepping_down()
            .await;
        // Finishes once both hand-overs are in.
        let _ = asked.await;
        Ok::<_, LockError>(())
    }));
    let b = campaign(&registry, "rota", "b");
    in_line(&a, 1).await;
    let c = campaign(&registry, "rota", "c");
    in_line(&a, 2).await;
    let hand_over = |to: &'static str| {
        let a = a.clone();
        tokio::spawn(async move { a.hand_over(to, LIMIT).await })
    };
    let to_b = hand_over("b");
    tokio::time::sleep(Duration::from_millis(10)).await;
    let to_c = hand_over("c");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!to_b.is_finished() && !to_c.is_finished(), "both wait");
    asked_tx.send(()).expect("the work waits");
    let to_b = to_b
        .await
        .expect("task")
        .expect("hand over")
        .expect("a led");
    let to_c = to_c
        .await
        .expect("task")
        .expect("hand over")
        .expect("a led");
    work.await.expect("task").expect("work");
    let b = tokio::time::timeout(LIMIT, b)
        .await
        .expect("b leads in time")
        .expect("task")
        .expect("elected");
    assert!(!c.is_finished(), "c waits on: the term went to b");
    assert!(to_b.to_successor && to_b.finished, "{to_b:?}");
    assert!(!to_c.to_successor && to_c.finished, "{to_c:?}");
    b.resign().await.expect("resign");
}

/// Two step-downs of a term whose work never returns: the second, with no grace, ends the
/// term at once, and neither call says the work finished (it was dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_dropped_when_any_grace_ran_out_is_not_finished_for_any_caller() {
    let registry = Registry::in_memory();
    let a = registry.election("rota").identity("a").ttl(LIMIT);
    let work = tokio::spawn(
        a.campaign()
            .await
            .expect("elected alone")
            .run(std::future::pending::<Result<(), LockError>>()),
    );
    let patient = stepping_down(&a).await;
    let hasty = tokio::time::timeout(LIMIT, a.step_down(Duration::ZERO))
        .await
        .expect("no grace: the term ends at once")
        .expect("step down")
        .expect("a led");
    let patient = tokio::time::timeout(LIMIT, patient)
        .await
        .expect("the first call returns with the second: one term, one end")
        .expect("task")
        .expect("step down")
        .expect("a led");
    let dropped = work.await.expect("task").unwrap_err();
    assert!(
        matches!(
            dropped,
            LockError::Lost {
                reason: LostReason::Released,
                ..
            }
        ),
        "{dropped:?}"
    );
    assert!(!hasty.finished, "{hasty:?}");
    assert!(!patient.finished, "the work was dropped: {patient:?}");
}

/// A term lost during the grace (an operator's force-unlock): its work is dropped as on any
/// lost term, and the step-down says it did not finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_lost_during_the_grace_did_not_finish() {
    let registry = Registry::in_memory();
    let a = registry.election("rota").identity("a").ttl(LIMIT);
    let work = tokio::spawn(
        a.campaign()
            .await
            .expect("elected alone")
            .run(std::future::pending::<Result<(), LockError>>()),
    );
    let stepping = stepping_down(&a).await;
    assert!(registry.force_unlock("rota").await.expect("force-unlock"));
    let ended = tokio::time::timeout(LIMIT, stepping)
        .await
        .expect("the step-down returns once the term is over")
        .expect("task")
        .expect("step down")
        .expect("a led");
    let dropped = work.await.expect("task").unwrap_err();
    assert!(dropped.is_lost(), "{dropped:?}");
    assert!(!ended.finished, "the work was dropped: {ended:?}");
}

/// A step-down asked from inside the term's own work would wait for that work to return: it is
/// refused at once, and the term goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_down_from_the_terms_own_work_is_refused_at_once() {
    let registry = Registry::in_memory();
    let a = registry.election("rota").identity("a").ttl(LIMIT);
    let me = a.clone();
    let refused = tokio::time::timeout(
        LIMIT,
        a.campaign().await.expect("elected alone").run(async move {
            let refused = me.step_down(LIMIT).await.unwrap_err();
            assert!(
                !lock_runtime::current().expect("leading").is_stepping_down(),
                "nothing was asked"
            );
            Ok::<_, LockError>(refused)
        }),
    )
    .await
    .expect("refused at once, not after the grace")
    .expect("the work returned");
    assert!(
        matches!(&refused, LockError::InvalidOptions { reason, .. } if reason.contains("return from")),
        "{refused:?}"
    );
}

/// A hand-over whose grace runs out as the holder resigns by hand: the keeper's release and the
/// holder's meet, and whichever comes second finds the term gone. The hand-over still says it
/// went to its successor, as it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_racing_the_end_of_the_grace_keeps_the_hand_over_to_its_successor() {
    let (mut wrong, mut handed_over) = (Vec::new(), 0);
    for round in 0..100u64 {
        let registry = Registry::in_memory();
        let a = registry.election("race").identity("a").ttl(LIMIT);
        let held = a.campaign().await.expect("elected alone");
        // c queues first: a release that is not b's by name goes to c.
        let c = campaign(&registry, "race", "c");
        in_line(&a, 1).await;
        let b = campaign(&registry, "race", "b");
        in_line(&a, 2).await;
        let handing = tokio::spawn({
            let a = a.clone();
            async move { a.hand_over("b", Duration::from_millis(5)).await }
        });
        tokio::time::sleep(Duration::from_micros(4_000 + (round % 20) * 100)).await;
        let _ = held.resign().await;
        let Some(ended) = handing.await.expect("task").expect("hand over") else {
            // The resign came first: no hand-over to race (a led no more when it asked).
            b.abort();
            c.abort();
            continue;
        };
        handed_over += 1;
        let b = tokio::time::timeout(LIMIT, b)
            .await
            .expect("b leads in time")
            .expect("task")
            .expect("elected");
        assert!(!c.is_finished(), "c waits on: the term went to b by name");
        if !ended.to_successor {
            wrong.push((round, ended));
        }
        c.abort();
        drop(b);
    }
    assert!(handed_over >= 20, "only {handed_over} rounds raced");
    assert!(
        wrong.is_empty(),
        "b led each time, yet {} hand-overs said otherwise: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
}

/// A caller that stops waiting for its hand-over stops waiting, not the hand-over: the term
/// still goes to the one it named (here once a later step-down, with no grace, ends it), and
/// that later step-down, which named nobody, does not say it went to its successor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_whose_caller_stopped_waiting_goes_on() {
    let registry = Registry::in_memory();
    let a = registry.election("bound").identity("a").ttl(LIMIT);
    let held = a.campaign().await.expect("elected alone");
    let c = campaign(&registry, "bound", "c");
    in_line(&a, 1).await;
    let b = campaign(&registry, "bound", "b");
    in_line(&a, 2).await;
    let gave_up = tokio::time::timeout(Duration::from_millis(100), a.hand_over("b", LIMIT)).await;
    assert!(gave_up.is_err(), "the caller stopped waiting");
    assert!(a.is_leader(), "a leads on, within the grace");
    let ended = a
        .step_down(Duration::ZERO)
        .await
        .expect("step down")
        .expect("a led");
    assert!(!ended.to_successor && !ended.finished, "{ended:?}");
    assert!(held.is_lost(), "over for its holder");
    let b = tokio::time::timeout(LIMIT, b)
        .await
        .expect("b leads in time")
        .expect("task")
        .expect("elected");
    assert!(!c.is_finished(), "c waits on: the term went to b by name");
    b.resign().await.expect("resign");
    let c = tokio::time::timeout(LIMIT, c)
        .await
        .expect("c next")
        .expect("task")
        .expect("elected");
    c.resign().await.expect("resign");
}
