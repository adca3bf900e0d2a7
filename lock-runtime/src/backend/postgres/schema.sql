-- The Postgres store's schema, version 1: the leases, the waiters' queue and the last fencing
-- token of each key, and the functions that change them. Every function serialises on its
-- keys with transaction-scoped advisory locks (taken in one global order, so two calls never
-- deadlock) and reads the database's clock after taking them: a lease's deadline is the
-- server's, never a client's. Each call is one statement in its own transaction, which is what
-- PgBouncer's transaction mode allows. Notifications go out at commit, on one channel per key
-- (`channel`), in the Redis scripts' format (see `backend/notification.rs`). Every statement
-- can run again: a function added within a version (`release_to`, `held_since`) is created by
-- running the whole schema once more, which a library that finds it missing does.
CREATE SCHEMA IF NOT EXISTS distributed_lock;

CREATE TABLE IF NOT EXISTS distributed_lock.schema_version (
    version integer PRIMARY KEY
);

-- Fencing tokens: one sequence for every key, so a key's tokens only rise.
CREATE SEQUENCE IF NOT EXISTS distributed_lock.fence;

-- One row per holder: a lock's one owner (`share` = ''), or each reader ('#read') or permit
-- holder ('#permits=N'). A row whose `expires_at` passed holds nothing.
CREATE TABLE IF NOT EXISTS distributed_lock.holders (
    key text NOT NULL,
    token text NOT NULL,
    -- The SHA-1 of the token, which notifications name (the token is a credential).
    tenure text NOT NULL,
    share text NOT NULL,
    expires_at timestamptz NOT NULL,
    fence bigint,
    PRIMARY KEY (key, token)
);
-- When the holder took the lock, or was handed it (`hand_over_to` inserts the waiter's row):
-- every INSERT gives the six columns above by position, so a new row gets the default, and
-- nothing that renews a row or grants it again (an UPDATE, an `ON CONFLICT ... DO UPDATE`)
-- touches it. Added within version 1: NULL (unknown) in the rows of a schema made before it.
-- Two statements: a volatile default given with the column would rewrite the table, under its
-- ACCESS EXCLUSIVE lock.
ALTER TABLE distributed_lock.holders ADD COLUMN IF NOT EXISTS since timestamptz;
ALTER TABLE distributed_lock.holders ALTER COLUMN since SET DEFAULT clock_timestamp();

-- Callers queued for an exclusive lock, served oldest first; a place lapses at `expires_at`
-- unless its waiter's next attempt renews it.
CREATE TABLE IF NOT EXISTS distributed_lock.waiters (
    key text NOT NULL,
    token text NOT NULL,
    tenure text NOT NULL,
    arrived bigint GENERATED ALWAYS AS IDENTITY,
    fencing boolean NOT NULL,
    -- The attempt that took or last kept the place, named back by a hand-over.
    place integer NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, token)
);
CREATE INDEX IF NOT EXISTS waiters_in_order ON distributed_lock.waiters (key, arrived);
-- A candidate standing aside (`stand_aside`) keeps its place, passed over by every hand-over.
-- Added within version 1: a schema made before it gains it here.
ALTER TABLE distributed_lock.waiters ADD COLUMN IF NOT EXISTS aside boolean NOT NULL DEFAULT false;

-- The last fencing token handed out for a key, for `inspect`, kept a day beyond its lease.
CREATE TABLE IF NOT EXISTS distributed_lock.fences (
    key text PRIMARY KEY,
    last bigint NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS fences_by_expiry ON distributed_lock.fences (expires_at);

-- The notification channel of a key: an identifier of at most 63 bytes, whatever the key.
CREATE OR REPLACE FUNCTION distributed_lock.channel(k text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'lock_' || md5(k) $$;

CREATE OR REPLACE FUNCTION distributed_lock.listen(k text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('LISTEN %I', distributed_lock.channel(k));
    RETURN distributed_lock.channel(k);
END $$;

CREATE OR REPLACE FUNCTION distributed_lock.unlisten(k text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('UNLISTEN %I', distributed_lock.channel(k));
END $$;

-- Serialises this transaction with every other one on these keys, and returns the time.
CREATE OR REPLACE FUNCTION distributed_lock.enter(keys text[]) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    h bigint;
BEGIN
    -- A holder row kept by an application's transaction (`hold`) is waited for at most this
    -- long; the call then fails (55P03, which the caller retries) instead of hanging.
    PERFORM set_config('lock_timeout', '500ms', true);
    -- A lease granted is on disk (or at least in the kernel's hands) before anyone hears of it,
    -- whatever the server's default: an asynchronous commit lost in a crash would hand the
    -- lock, and the fencing sequence's last tokens, out a second time.
    PERFORM set_config('synchronous_commit', 'on', true);
    FOR h IN SELECT DISTINCT hashtextextended(k, 0) FROM unnest(keys) AS k ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(h);
    END LOOP;
    RETURN clock_timestamp();
END $$;

CREATE OR REPLACE FUNCTION distributed_lock.ms(d interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT greatest(ceil(extract(epoch FROM d) * 1000), 0)::bigint $$;

-- Records `f` as the last token of each of `ks`, kept a day beyond a lease held until `until`
-- (never lowered, never shortened).
CREATE OR REPLACE FUNCTION distributed_lock.keep_fence(ks text[], f bigint, until timestamptz)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO distributed_lock.fences AS c
    SELECT k, f, until + interval '1 day' FROM unnest(ks) AS k
    ON CONFLICT (key) DO UPDATE SET last = greatest(c.last, excluded.last),
        expires_at = greatest(c.expires_at, excluded.expires_at)
$$;

-- The next fencing token, for a lease held until `until`.
CREATE OR REPLACE FUNCTION distributed_lock.next_fence(k text, until timestamptz) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    f bigint := nextval('distributed_lock.fence');
BEGIN
    PERFORM distributed_lock.keep_fence(ARRAY[k], f, until);
    -- A few lapsed counters go with each new token: the table stays bounded.
    DELETE FROM distributed_lock.fences WHERE key IN (
        SELECT key FROM distributed_lock.fences WHERE expires_at < until - interval '1 day'
        LIMIT 4 FOR UPDATE SKIP LOCKED);
    RETURN f;
END $$;

-- Gives the free lock `k` to its oldest live waiter not standing aside and tells it (`released`: the tenure whose
-- release freed it, or ''); the new holder's token and lease, or NULLs with no waiter.
CREATE OR REPLACE FUNCTION distributed_lock.hand_over(k text, t timestamptz, released text,
    OUT token text, OUT expires_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT h.token, h.expires_at INTO token, expires_at
    FROM distributed_lock.hand_over_to(k, t, released, NULL) AS h;
END $$;

-- As `hand_over`, but to the first live place of the candidate that campaigns as `successor`
-- (a candidate's token is `<identity>@<host>:<pid>:<random>`, and no host has an `@`) where one
-- is in line, leaving the places before it; `named` says whether it went to that candidate.
CREATE OR REPLACE FUNCTION distributed_lock.hand_over_to(k text, t timestamptz, released text,
    successor text, OUT token text, OUT expires_at timestamptz, OUT named boolean)
LANGUAGE plpgsql AS $$
DECLARE
    w distributed_lock.waiters;
    f bigint := 0;
BEGIN
    DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.expires_at <= t;
    named := false;
    IF successor IS NOT NULL THEN
        SELECT * INTO w FROM distributed_lock.waiters AS q
        WHERE q.key = k AND NOT q.aside AND substring(q.token FROM '^(.*)@[^@]*$') = successor
        ORDER BY q.arrived LIMIT 1;
        named := FOUND;
    END IF;
    IF NOT named THEN
        SELECT * INTO w FROM distributed_lock.waiters AS q WHERE q.key = k AND NOT q.aside
        ORDER BY q.arrived LIMIT 1;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.token = w.token;
    IF w.fencing THEN
        f := distributed_lock.next_fence(k, w.expires_at);
    END IF;
    INSERT INTO distributed_lock.holders
    VALUES (k, w.token, w.tenure, '', w.expires_at, CASE WHEN w.fencing THEN f END);
    PERFORM pg_notify(distributed_lock.channel(k), released || ':' || w.tenure || ':' || f || ':' || w.place);
    token := w.token;
    expires_at := w.expires_at;
END $$;

-- Takes or keeps a caller's place in `k`'s queue for one ttl (no longer standing aside).
CREATE OR REPLACE FUNCTION distributed_lock.queue_up(k text, tok text, ten text, fencing boolean,
    place integer, until timestamptz) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO distributed_lock.waiters AS q (key, token, tenure, fencing, place, expires_at)
    VALUES (k, tok, ten, fencing, place, until)
    ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at, place = excluded.place,
        aside = false
$$;

-- An attempt of an election's candidate standing aside: it takes or keeps its place for one
-- ttl, marked, and never takes the lock; a free lock goes to the oldest live waiter not
-- standing aside. Busy: the holder and the lease to wait for, or NULLs when the lock stays
-- free. One that finds its own token holding the lock (handed to it as it stood aside, or a
-- late attempt of a candidate that rejoined and leads since) keeps it, as `acquire` would:
-- the candidate decides, and a late attempt never ends a term.
CREATE OR REPLACE FUNCTION distributed_lock.stand_aside(k text, tok text, ten text,
    ttl_ms bigint, fencing boolean, place integer, OUT acquired boolean, OUT fence bigint,
    OUT retry_after_ms bigint, OUT holder text)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ARRAY[k]);
    until timestamptz := t + ttl_ms * interval '1 millisecond';
    owner distributed_lock.holders;
BEGIN
    acquired := false;
    DELETE FROM distributed_lock.holders AS h WHERE h.key = k AND h.expires_at <= t;
    UPDATE distributed_lock.holders AS h SET expires_at = until
    WHERE h.key = k AND h.token = tok AND h.share = '' RETURNING h.fence INTO fence;
    IF FOUND THEN
        DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.token = tok;
        acquired := true;
        RETURN;
    END IF;
    INSERT INTO distributed_lock.waiters AS q
        (key, token, tenure, fencing, place, expires_at, aside)
    VALUES (k, tok, ten, fencing, place, until, true)
    ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at,
        place = excluded.place, aside = true;
    IF NOT EXISTS (SELECT FROM distributed_lock.holders AS h WHERE h.key = k) THEN
        PERFORM distributed_lock.hand_over(k, t, '');
    END IF;
    SELECT * INTO owner FROM distributed_lock.holders AS h WHERE h.key = k
    ORDER BY h.expires_at LIMIT 1;
    IF owner.token IS NOT NULL THEN
        holder := CASE WHEN owner.share = '' THEN owner.token ELSE owner.share END;
        retry_after_ms := distributed_lock.ms(owner.expires_at - t);
    END IF;
END $$;

-- One attempt on one key. `share`: '' for the lock itself, '#read', or '#permits=N' (`lim`
-- permits). Acquired: `fence` (with `fencing`). Busy: the holder (a token, or a shared key's
-- tag) and the lease to wait for; the caller queues up when `queue` (exclusive only).
-- `mismatch`: the key is held shared in another way (nothing changed).
CREATE OR REPLACE FUNCTION distributed_lock.acquire(k text, tok text, ten text, ttl_ms bigint,
    fencing boolean, queue boolean, place integer, share text, lim integer,
    OUT acquired boolean, OUT fence bigint, OUT retry_after_ms bigint, OUT holder text,
    OUT mismatch text)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ARRAY[k]);
    until timestamptz := t + ttl_ms * interval '1 millisecond';
    owner distributed_lock.holders;
    pool record;
    head record;
    handed record;
    busy_until timestamptz;
BEGIN
    acquired := false;
    DELETE FROM distributed_lock.holders AS h WHERE h.key = k AND h.expires_at <= t;
    SELECT * INTO owner FROM distributed_lock.holders AS h WHERE h.key = k AND h.share = '';
    SELECT min(h.share) AS share, count(*) AS n, min(h.expires_at) AS soonest,
           bool_or(h.token = tok) AS mine
    INTO pool FROM distributed_lock.holders AS h WHERE h.key = k AND h.share <> '';

    -- Busy for the caller: `holder` and `busy_until` say whose lease to wait for.
    IF owner.token IS NOT NULL AND owner.token <> tok THEN
        holder := owner.token;
        busy_until := owner.expires_at;
    ELSIF share = '' AND pool.n > 0 THEN
        holder := pool.share;
        busy_until := pool.soonest;
    ELSIF share = '' AND owner.token IS NULL THEN
        -- A free lock goes to the oldest live waiter, if that is not the caller.
        DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.expires_at <= t;
        SELECT q.token INTO head FROM distributed_lock.waiters AS q WHERE q.key = k
            AND NOT q.aside
        ORDER BY q.arrived LIMIT 1;
        IF head.token IS NOT NULL AND head.token <> tok THEN
            SELECT * INTO handed FROM distributed_lock.hand_over(k, t, '');
            holder := handed.token;
            busy_until := handed.expires_at;
        END IF;
    END IF;
    IF holder IS NOT NULL THEN
        retry_after_ms := distributed_lock.ms(busy_until - t);
        IF queue AND share = '' THEN
            PERFORM distributed_lock.queue_up(k, tok, ten, fencing, place, until);
        END IF;
        RETURN;
    END IF;

    IF share = '' THEN
        DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.token = tok;
        IF fencing THEN
            -- A holder asking again keeps its fence.
            fence := coalesce(owner.fence, distributed_lock.next_fence(k, until));
        END IF;
        INSERT INTO distributed_lock.holders AS h VALUES (k, tok, ten, '', until, fence)
        ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at,
            fence = excluded.fence;
        acquired := true;
        RETURN;
    END IF;

    -- A reader or a permit taker.
    IF pool.n > 0 AND pool.share <> share THEN
        mismatch := pool.share;
        RETURN;
    END IF;
    IF pool.n > 0 AND NOT pool.mine THEN
        DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.expires_at <= t;
        SELECT min(q.expires_at) AS soonest INTO head FROM distributed_lock.waiters AS q
        WHERE q.key = k;
        IF pool.n >= lim OR head.soonest IS NOT NULL THEN
            holder := share;
            retry_after_ms := distributed_lock.ms(least(pool.soonest, head.soonest) - t);
            RETURN;
        END IF;
    ELSIF pool.n = 0 THEN
        SELECT * INTO handed FROM distributed_lock.hand_over(k, t, '');
        IF handed.token IS NOT NULL THEN
            holder := handed.token;
            retry_after_ms := distributed_lock.ms(handed.expires_at - t);
            RETURN;
        END IF;
    END IF;
    INSERT INTO distributed_lock.holders AS h VALUES (k, tok, ten, share, until, NULL)
    ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at;
    acquired := true;
END $$;

-- A multi-key lock's attempt: every key or none, with one fencing token above every key's
-- earlier ones. Busy: `at` is the first key held by someone else.
CREATE OR REPLACE FUNCTION distributed_lock.acquire_all(ks text[], tok text, ten text,
    ttl_ms bigint, fencing boolean,
    OUT acquired boolean, OUT fence bigint, OUT retry_after_ms bigint, OUT holder text,
    OUT at integer)
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ks);
    until timestamptz := t + ttl_ms * interval '1 millisecond';
    h distributed_lock.holders;
BEGIN
    acquired := false;
    DELETE FROM distributed_lock.holders AS x WHERE x.key = ANY (ks) AND x.expires_at <= t;
    FOR i IN 1 .. cardinality(ks) LOOP
        SELECT * INTO h FROM distributed_lock.holders AS x
        WHERE x.key = ks[i] AND (x.token <> tok OR x.share <> '')
        ORDER BY x.expires_at LIMIT 1;
        IF FOUND THEN
            at := i - 1;
            holder := CASE WHEN h.share = '' THEN h.token ELSE h.share END;
            retry_after_ms := distributed_lock.ms(h.expires_at - t);
            RETURN;
        END IF;
    END LOOP;
    IF fencing THEN
        fence := nextval('distributed_lock.fence');
        PERFORM distributed_lock.keep_fence(ks, fence, until);
    END IF;
    INSERT INTO distributed_lock.holders AS x
    SELECT k, tok, ten, '', until, fence FROM unnest(ks) AS k
    ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at, fence = excluded.fence;
    acquired := true;
END $$;

-- Lets go of `tok`'s hold on each key (and its place in the queue), handing a freed lock to
-- the oldest live waiter; whether every key was held by `tok`.
CREATE OR REPLACE FUNCTION distributed_lock.release(ks text[], tok text, ten text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ks);
    k text;
    mine boolean := true;
    left_queue boolean;
    was distributed_lock.holders;
    handed record;
BEGIN
    FOREACH k IN ARRAY ks LOOP
        DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.token = tok;
        left_queue := FOUND;
        DELETE FROM distributed_lock.holders AS h WHERE h.key = k AND h.token = tok
        RETURNING * INTO was;
        IF was.token IS NULL OR was.expires_at <= t THEN
            mine := false;
            -- A waiter for the whole lock left: whoever it held off may enter.
            IF left_queue AND NOT EXISTS (SELECT FROM distributed_lock.holders AS h
                    WHERE h.key = k AND h.share = '' AND h.expires_at > t) THEN
                PERFORM pg_notify(distributed_lock.channel(k), 'left');
            END IF;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT FROM distributed_lock.holders AS h
                WHERE h.key = k AND h.expires_at > t) THEN
            SELECT * INTO handed FROM distributed_lock.hand_over(k, t, ten);
            IF handed.token IS NOT NULL THEN
                CONTINUE;
            END IF;
        END IF;
        PERFORM pg_notify(distributed_lock.channel(k), ten);
    END LOOP;
    RETURN mine;
END $$;

-- As `release` of one key held alone, but a freed lock goes to the candidate that campaigns as
-- `successor` where one is in line (`hand_over_to`): 0 when `tok` did not hold it, 3 when it
-- went to `successor`, else 1.
CREATE OR REPLACE FUNCTION distributed_lock.release_to(k text, tok text, ten text, successor text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ARRAY[k]);
    was distributed_lock.holders;
    handed record;
BEGIN
    DELETE FROM distributed_lock.waiters AS q WHERE q.key = k AND q.token = tok;
    DELETE FROM distributed_lock.holders AS h WHERE h.key = k AND h.token = tok
    RETURNING * INTO was;
    IF was.token IS NULL OR was.expires_at <= t THEN
        RETURN 0;
    END IF;
    IF NOT EXISTS (SELECT FROM distributed_lock.holders AS h
            WHERE h.key = k AND h.expires_at > t) THEN
        SELECT * INTO handed FROM distributed_lock.hand_over_to(k, t, ten, successor);
        IF handed.token IS NOT NULL THEN
            RETURN CASE WHEN handed.named THEN 3 ELSE 1 END;
        END IF;
    END IF;
    PERFORM pg_notify(distributed_lock.channel(k), ten);
    RETURN 1;
END $$;

-- Sets the lease of each (key, token) still held to its ttl: 'yes', 'gone' (no live lock, or
-- a shared key without this holder) or 'taken' (someone else holds it alone), in order.
CREATE OR REPLACE FUNCTION distributed_lock.renew(ks text[], toks text[], ttls bigint[],
    fences bigint[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ks);
    until timestamptz;
    found_ text[] := '{}';
BEGIN
    FOR i IN 1 .. cardinality(ks) LOOP
        until := t + ttls[i] * interval '1 millisecond';
        UPDATE distributed_lock.holders AS h SET expires_at = until
        WHERE h.key = ks[i] AND h.token = toks[i] AND h.expires_at > t;
        IF FOUND THEN
            found_ := found_ || 'yes'::text;
            IF fences[i] IS NOT NULL THEN
                PERFORM distributed_lock.keep_fence(ARRAY[ks[i]], fences[i], until);
            END IF;
        ELSIF EXISTS (SELECT FROM distributed_lock.holders AS h
                WHERE h.key = ks[i] AND h.share = '' AND h.expires_at > t) THEN
            found_ := found_ || 'taken'::text;
        ELSE
            found_ := found_ || 'gone'::text;
        END IF;
    END LOOP;
    RETURN found_;
END $$;

-- Who holds `k` and who waits for it, with the time each has left, and its last fence:
-- rows of ('holder' | 'waiter' | 'aside' (a waiter standing aside) | 'fence', token, share,
-- remaining_ms, fence).
CREATE OR REPLACE FUNCTION distributed_lock.inspect(k text)
RETURNS TABLE (kind text, token text, share text, remaining_ms bigint, fence bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'holder', h.token, h.share, distributed_lock.ms(h.expires_at - clock_timestamp()), h.fence
    FROM distributed_lock.holders AS h WHERE h.key = k AND h.expires_at > clock_timestamp()
    UNION ALL
    (SELECT CASE WHEN q.aside THEN 'aside' ELSE 'waiter' END, q.token, '',
            distributed_lock.ms(q.expires_at - clock_timestamp()), NULL
     FROM distributed_lock.waiters AS q WHERE q.key = k AND q.expires_at > clock_timestamp()
     ORDER BY q.arrived)
    UNION ALL
    SELECT 'fence', NULL, NULL, NULL, c.last
    FROM distributed_lock.fences AS c WHERE c.key = k AND c.expires_at > clock_timestamp()
$$;

-- How long each live holder of `k` has held it, where that is known (`since`): rows of
-- (token, held_ms). Apart from `inspect`, whose result an older library reads as it is.
CREATE OR REPLACE FUNCTION distributed_lock.held_since(k text)
RETURNS TABLE (token text, held_ms bigint)
LANGUAGE sql STABLE AS $$
    SELECT h.token, distributed_lock.ms(clock_timestamp() - h.since)
    FROM distributed_lock.holders AS h
    WHERE h.key = k AND h.expires_at > clock_timestamp() AND h.since IS NOT NULL
$$;

-- An operator's decision: whatever holds `k` lets go, and its waiters are woken.
CREATE OR REPLACE FUNCTION distributed_lock.force_unlock(k text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := distributed_lock.enter(ARRAY[k]);
BEGIN
    DELETE FROM distributed_lock.holders AS h WHERE h.key = k AND h.expires_at <= t;
    DELETE FROM distributed_lock.holders AS h WHERE h.key = k;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(distributed_lock.channel(k), 'unlocked');
    RETURN true;
END $$;

-- Run inside the application's own transaction: fails (SQLSTATE 55000) unless `tok` holds each
-- of `ks` now, and keeps each holder row from being deleted (released, or taken over once its
-- lease ran out) until that transaction ends, so that the transaction commits only while the
-- lock is held. Renewals still pass (they change no key column: FOR KEY SHARE lets them).
CREATE OR REPLACE FUNCTION distributed_lock.hold(ks text[], tok text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
BEGIN
    SELECT count(*) INTO held FROM (
        SELECT FROM distributed_lock.holders AS h
        WHERE h.key = ANY (ks) AND h.token = tok AND h.expires_at > clock_timestamp()
        FOR KEY SHARE) AS rows;
    IF held < cardinality(ks) THEN
        RAISE EXCEPTION 'lock % is no longer held by this holder: its lease ran out or was taken over, so this transaction must not commit', array_to_string(ks, ' + ')
            USING ERRCODE = '55000', HINT = 'roll back, and take the lock again before redoing the work';
    END IF;
END $$;

INSERT INTO distributed_lock.schema_version VALUES (1) ON CONFLICT DO NOTHING;
