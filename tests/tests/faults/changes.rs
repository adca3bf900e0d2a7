//! Who held each lock on Postgres, and until when, rebuilt from a log of every change to the
//! store's holders' table that a trigger of the test's own writes inside the changing
//! transaction. Unlike `MONITOR`, the log holds exactly what committed, and survives a crash
//! with it, so the history has no gaps and no outages. What can be read off it:
//!
//! - (d) no change gave a holder's row another token, extended a lease that had lapsed (a
//!   lapsed lease is nobody's), or shortened a live one.
//!
//! A row inserted starts a tenure; an update sets its new deadline; a delete ends it. An
//! insert and a delete are stamped with the database's clock when they ran; an update with the
//! start of its statement, which the store's functions only let extend a lease that was still
//! live after they took their keys' locks, later: the lease is held throughout either way.

use serde::{Deserialize, Serialize};

use super::model::{History, Tenure};

/// The test's log of the holders' table, and the trigger that writes it.
pub const CHANGE_LOG: &str = "
CREATE SCHEMA lock_tests;
CREATE TABLE lock_tests.changes (
    id bigserial PRIMARY KEY,
    op text NOT NULL,
    at_us bigint NOT NULL,
    key text NOT NULL,
    token text NOT NULL,
    share text NOT NULL,
    old_until_us bigint,
    new_until_us bigint,
    new_token text
);
CREATE FUNCTION lock_tests.us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT (extract(epoch FROM t) * 1000000)::bigint $$;
CREATE FUNCTION lock_tests.log_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO lock_tests.changes (op, at_us, key, token, share, new_until_us)
        VALUES ('I', lock_tests.us(clock_timestamp()), NEW.key, NEW.token, NEW.share,
                lock_tests.us(NEW.expires_at));
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO lock_tests.changes
            (op, at_us, key, token, share, old_until_us, new_until_us, new_token)
        VALUES ('U', lock_tests.us(statement_timestamp()), OLD.key, OLD.token, OLD.share,
                lock_tests.us(OLD.expires_at), lock_tests.us(NEW.expires_at), NEW.token);
    ELSE
        INSERT INTO lock_tests.changes (op, at_us, key, token, share, old_until_us)
        VALUES ('D', lock_tests.us(clock_timestamp()), OLD.key, OLD.token, OLD.share,
                lock_tests.us(OLD.expires_at));
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER log_change AFTER INSERT OR UPDATE OR DELETE ON distributed_lock.holders
FOR EACH ROW EXECUTE FUNCTION lock_tests.log_change();
";

/// Reads the log back, in the order the changes were made: one line per change, fields
/// separated by [`SEPARATOR`], as `psql -A -t` prints them.
pub const READ: &str = "SELECT op, at_us, key, token, share, coalesce(old_until_us::text, ''), \
     coalesce(new_until_us::text, ''), coalesce(new_token, '') FROM lock_tests.changes ORDER BY id";

/// The field separator [`READ`]'s output is printed with.
pub const SEPARATOR: char = '\u{1f}';

/// One row inserted (`I`), updated (`U`) or deleted (`D`) in the holders' table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub op: char,
    pub at_us: i64,
    pub key: String,
    pub token: String,
    /// '' for a lock's one owner; a reader's or permit holder's kind of place otherwise.
    pub share: String,
    /// The lease's deadline before the change (updates, deletes), µs.
    pub old_until_us: Option<i64>,
    /// The lease's deadline after it (inserts, updates), µs.
    pub new_until_us: Option<i64>,
    /// The token after an update.
    pub new_token: Option<String>,
}

impl Change {
    /// One line of [`READ`]'s output.
    pub fn parse(line: &str) -> Self {
        let f: Vec<&str> = line.split(SEPARATOR).collect();
        assert_eq!(f.len(), 8, "a change log line has 8 fields: {line:?}");
        let number = |s: &str| -> Option<i64> {
            (!s.is_empty()).then(|| s.parse().expect("a number of µs"))
        };
        Self {
            op: f[0].chars().next().expect("an operation"),
            at_us: f[1].parse().expect("µs"),
            key: f[2].to_owned(),
            token: f[3].to_owned(),
            share: f[4].to_owned(),
            old_until_us: number(f[5]),
            new_until_us: number(f[6]),
            new_token: (!f[7].is_empty()).then(|| f[7].to_owned()),
        }
    }
}

/// A deadline in µs as the model's expiry in ms, never later than the deadline: the model
/// counts a lock gone one ms after its expiry, a place at it.
fn expiry_ms(until_us: i64, place: bool) -> i64 {
    let ms = until_us.div_euclid(1000);
    if place {
        ms
    } else {
        ms - 1
    }
}

/// The tenures the log shows, and what (d) finds in it.
pub fn history(changes: &[Change]) -> History {
    let mut h = History {
        commands: changes.len(),
        ..History::default()
    };
    // The open tenure of each (key, token): its index in `h.tenures`.
    let mut open: std::collections::HashMap<(&str, &str), usize> = Default::default();
    for c in changes {
        let id = (c.key.as_str(), c.token.as_str());
        match c.op {
            'I' => {
                let until = c.new_until_us.expect("an insert's deadline");
                let place = !c.share.is_empty();
                open.insert(id, h.tenures.len());
                h.tenures.push(Tenure {
                    key: c.key.clone(),
                    place,
                    token: c.token.clone(),
                    since_us: c.at_us,
                    expiries: vec![(c.at_us, expiry_ms(until, place))],
                    ended_us: None,
                    ended_by: "",
                });
            }
            'U' => {
                let (old, new) = (
                    c.old_until_us.expect("an update's old deadline"),
                    c.new_until_us.expect("an update's new deadline"),
                );
                let Some(&i) = open.get(&id) else {
                    h.violations.push(format!(
                        "(d) {} of {} updated at {} with no row inserted before",
                        c.token, c.key, c.at_us
                    ));
                    continue;
                };
                if c.new_token.as_deref() != Some(c.token.as_str()) {
                    h.violations.push(format!(
                        "(d) the row of {} for {} was given token {:?} at {}",
                        c.key, c.token, c.new_token, c.at_us
                    ));
                }
                if old <= c.at_us {
                    h.violations.push(format!(
                        "(d) the lease of {} on {} that lapsed at {old} was extended at {} to {new}",
                        c.token, c.key, c.at_us
                    ));
                }
                if new < old {
                    h.violations.push(format!(
                        "(d) the live lease of {} on {} was shortened from {old} to {new} at {}",
                        c.token, c.key, c.at_us
                    ));
                }
                h.renewals += usize::from(new > old);
                let t = &mut h.tenures[i];
                t.expiries.push((c.at_us, expiry_ms(new, t.place)));
            }
            'D' => {
                let Some(i) = open.remove(&id) else {
                    h.violations.push(format!(
                        "(d) {} of {} deleted at {} with no row inserted before",
                        c.token, c.key, c.at_us
                    ));
                    continue;
                };
                let t = &mut h.tenures[i];
                t.ended_us = Some(c.at_us);
                t.ended_by = if c.old_until_us.is_some_and(|u| u <= c.at_us) {
                    "deleted after its lease lapsed"
                } else {
                    "deleted"
                };
            }
            other => panic!("a change log operation is I, U or D, not {other}"),
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(op: char, at_us: i64, token: &str, old: Option<i64>, new: Option<i64>) -> Change {
        Change {
            op,
            at_us,
            key: "lock:register".into(),
            token: token.into(),
            share: String::new(),
            old_until_us: old,
            new_until_us: new,
            new_token: (op == 'U').then(|| token.into()),
        }
    }

    #[test]
    fn a_lease_is_held_from_its_insert_through_its_renewals_until_its_delete() {
        let h = history(&[
            change('I', 1_000, "a", None, Some(1_001_000)),
            change('U', 300_000, "a", Some(1_001_000), Some(1_300_500)),
            change('D', 400_000, "a", Some(1_300_500), None),
        ]);
        assert!(h.violations.is_empty(), "{:?}", h.violations);
        assert_eq!(h.renewals, 1);
        let t = &h.tenures[0];
        assert!(t.covers(1_000, 399_999));
        assert_eq!(t.held_until(), 400_000);
        // Without the delete, the lease would end at its deadline, never later.
        assert!(t.expires_at(350_000) <= 1_300_500);
        assert!(t.expires_at(350_000) > 1_299_000);
        assert!(t.expires_at(100) <= 1_001_000);
    }

    #[test]
    fn a_revived_shortened_or_retokened_lease_is_a_violation() {
        let mut retoken = change('U', 2_000, "a", Some(900_000), Some(1_000_000));
        retoken.new_token = Some("b".into());
        let h = history(&[
            change('I', 1_000, "a", None, Some(500_000)),
            change('U', 600_000, "a", Some(500_000), Some(1_600_000)),
            change('I', 1_000, "c", None, Some(900_000)),
            change('U', 2_000, "c", Some(900_000), Some(800_000)),
            change('I', 1_000, "a2", None, Some(900_000)),
            Change {
                token: "a2".into(),
                ..retoken
            },
            change('D', 3_000, "nobody", Some(5), None),
        ]);
        let found = h.violations.join("\n");
        assert_eq!(h.violations.len(), 4, "{found}");
        assert!(found.contains("lapsed at 500000 was extended"), "{found}");
        assert!(found.contains("shortened from 900000 to 800000"), "{found}");
        assert!(found.contains("given token Some(\"b\")"), "{found}");
        assert!(found.contains("nobody of lock:register deleted"), "{found}");
    }

    #[test]
    fn a_line_of_the_log_reads_back_as_written() {
        let s = SEPARATOR;
        let line = format!("U{s}10{s}lock:k{s}h:1:a{s}#read{s}900{s}1010{s}h:1:a");
        let c = Change::parse(&line);
        assert_eq!(
            c,
            Change {
                op: 'U',
                at_us: 10,
                key: "lock:k".into(),
                token: "h:1:a".into(),
                share: "#read".into(),
                old_until_us: Some(900),
                new_until_us: Some(1010),
                new_token: Some("h:1:a".into()),
            }
        );
        let insert = Change::parse(&format!("I{s}10{s}lock:k{s}h:1:a{s}{s}{s}1010{s}"));
        assert_eq!((insert.old_until_us, insert.new_token), (None, None));
    }
}
