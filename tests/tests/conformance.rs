//! One contract, every store: each behaviour of `Store` (exclusion, owner-checked release and
//! renewal, fencing, hand-over order, waiting without polling, leases lost and reported,
//! permits, readers and writers, several keys, inspect (and how long a lock is held), force-unlock, elections, stepping down, standing aside) is written once in
//! `conformance/behaviours.rs` and run on memory, a single node, a single node whose replica
//! confirms every write, Sentinel, Cluster and Redlock: `conformance::<behaviour>::<store>`.
//! What a store does not do it declares (`Store::lacks`), and the behaviour checks its refusal
//! or weaker promise instead, printing the reason.

mod conformance {
    mod behaviours;
    mod stores;

    /// For each behaviour, a module with one test per store, each on a store of its own.
    macro_rules! on_every_store {
        ($($behaviour:ident),* $(,)?) => {$(
            mod $behaviour {
                on_every_store!(@stores $behaviour:
                    memory: Memory,
                    single_node: SingleNode,
                    confirmed_by_a_replica: Confirmed,
                    sentinel: Sentinel,
                    cluster: Cluster,
                    redlock: Redlock,
                    postgres: Postgres,
                );
            }
        )*};
        (@stores $behaviour:ident: $($store:ident: $kind:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $store() {
                let store = super::stores::Store::start(super::stores::Kind::$kind);
                super::behaviours::$behaviour(&store).await;
            }
        )*};
    }

    on_every_store!(
        exclusion,
        release_and_renewal_are_owner_checked,
        fencing_tokens_rise_with_every_holder,
        waiters_are_served_first_come_first_served,
        a_waiter_is_woken_by_the_release_without_polling,
        a_lease_taken_away_is_lost_and_reported,
        permits_are_held_up_to_their_number,
        readers_share_and_a_writer_holds_alone,
        several_keys_are_taken_all_or_none,
        inspect_shows_owner_lease_fence_and_queue,
        inspect_shows_how_long_the_owner_has_held_the_lock,
        force_unlock_frees_any_holders_lock,
        an_election_has_one_leader_at_a_time,
        a_leader_steps_down_and_hands_over_to_a_named_candidate,
        a_candidate_standing_aside_is_passed_over_until_it_rejoins,
    );
}
