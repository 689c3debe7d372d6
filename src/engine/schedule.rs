//! Schedules: when a schedule's next fire is, and what a due fire does, decided without a
//! clock or I/O (the driver passes `now` and when this process started).
//!
//! A schedule is a cron expression (five fields, or six with seconds first) read in an
//! IANA time zone. Daylight-saving transitions follow Vixie cron, as the `croner` crate
//! implements them: a fixed-time schedule (`30 2 * * *`) whose time falls in the hour
//! that is skipped in spring fires once at the first minute after the gap (03:00), and
//! once only, at the first pass, on the autumn day that repeats the hour; an interval
//! schedule (`*/15 * * * *`) skips the times that do not exist and fires at each that
//! does, in both passes of a repeated hour.
//!
//! A fire that came due before this process started was missed (the service was down):
//! `catch_up: one` starts one run for all of a schedule's missed fires, `none` skips
//! them. A fire due since the start is on time and starts a run, one run however many
//! fires it stands for. `overlap: skip` starts nothing while the schedule's previous run
//! is unfinished. The next fire is always the first one after `now`, so a fire is never
//! taken twice.

use std::str::FromStr;

use chrono::{TimeZone, Utc};

use super::{RunId, Timestamp};

/// What happens to fires missed while the service was down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// They are skipped.
    None,
    /// One run stands for all of them.
    One,
}

/// What a fire does while the schedule's previous run is still in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// It starts a run anyway.
    Allow,
    /// It starts nothing.
    Skip,
}

impl CatchUp {
    pub const NAMES: &[&str] = &["none", "one"];

    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::One => "one",
        }
    }

    pub fn parse(name: &str) -> Option<CatchUp> {
        match name {
            "none" => Some(CatchUp::None),
            "one" => Some(CatchUp::One),
            _ => None,
        }
    }
}

impl Overlap {
    pub const NAMES: &[&str] = &["allow", "skip"];

    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
        }
    }

    pub fn parse(name: &str) -> Option<Overlap> {
        match name {
            "allow" => Some(Overlap::Allow),
            "skip" => Some(Overlap::Skip),
            _ => None,
        }
    }
}

/// A schedule and what it did last. The pipeline it starts is the store's business.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub name: String,
    pub cron: String,
    pub timezone: String,
    pub catch_up: CatchUp,
    pub overlap: Overlap,
    pub paused: bool,
    pub created_at: Timestamp,
    /// `None` while paused.
    pub next_fire: Option<Timestamp>,
    /// When a fire was last taken (a run started or the fire skipped).
    pub last_fire: Option<Timestamp>,
    /// The run the schedule started last.
    pub last_run: Option<RunId>,
    pub runs_started: u64,
    pub fires_skipped: u64,
    /// The last skipped fire: when, and why in a sentence.
    pub last_skip: Option<(Timestamp, String)>,
}

/// A schedule's cron expression read in its time zone.
#[derive(Clone, Debug)]
pub struct Spec {
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

/// A cron expression or time zone that cannot be used: which of the two, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

impl Spec {
    pub fn parse(cron: &str, timezone: &str) -> Result<Spec, SpecError> {
        if cron.len() > crate::limits::SCHEDULE_CRON_MAX_BYTES {
            return Err(SpecError {
                field: "cron",
                message: format!(
                    "longer than {} bytes",
                    crate::limits::SCHEDULE_CRON_MAX_BYTES
                ),
            });
        }
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|error| SpecError {
                field: "cron",
                message: format!(
                    "{cron:?} is not a cron expression (minute hour day-of-month month day-of-week, optionally seconds first): {error}"
                ),
            })?;
        let zone = chrono_tz::Tz::from_str(timezone).map_err(|_| SpecError {
            field: "timezone",
            message: format!(
                "{timezone:?} is not an IANA time zone name (like UTC or Europe/Berlin)"
            ),
        })?;
        let spec = Spec { cron: parsed, zone };
        // An expression that never matches (30 February) is refused now rather than
        // sitting without a next fire.
        if spec.next_after(Timestamp(0)).is_none() {
            return Err(SpecError {
                field: "cron",
                message: format!("{cron:?} never matches a date"),
            });
        }
        Ok(spec)
    }

    /// The first fire strictly after `after`; `None` when there is none before the
    /// calendar's end.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        // Fires fall on whole seconds: searching after the whole second `after` falls in
        // gives the first one later than `after` itself.
        let seconds = i64::try_from(after.0 / 1000).ok()?;
        let start = Utc
            .timestamp_opt(seconds, 0)
            .single()?
            .with_timezone(&self.zone);
        let next = self.cron.find_next_occurrence(&start, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok().map(Timestamp)
    }

    /// `at` on the schedule's own clock, as RFC 3339 with its offset.
    pub fn local_time(&self, at: Timestamp) -> Option<String> {
        let millis = i64::try_from(at.0).ok()?;
        let time = Utc.timestamp_millis_opt(millis).single()?;
        Some(time.with_timezone(&self.zone).to_rfc3339())
    }
}

/// What one due fire of a schedule does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Start a run now.
    pub start: bool,
    /// Fires missed while the service was down (counted up to
    /// `limits::SCHEDULE_MISSED_COUNTED`).
    pub missed: u64,
    /// Why nothing starts, when nothing does.
    pub skip: Option<String>,
    /// The schedule's next fire.
    pub next: Option<Timestamp>,
}

impl Schedule {
    /// What the schedule does now that its `next_fire` is due. `started_at` is when this
    /// process started (fires before it were missed); `previous_active` the schedule's
    /// last run if it is still in progress.
    pub fn on_due(
        &self,
        spec: &Spec,
        now: Timestamp,
        started_at: Timestamp,
        previous_active: Option<RunId>,
    ) -> Decision {
        let next = spec.next_after(now);
        let Some(due) = self.next_fire.filter(|due| *due <= now) else {
            return Decision {
                start: false,
                missed: 0,
                skip: None,
                next: self.next_fire.or(next),
            };
        };
        let mut missed = 0;
        let mut fire = Some(due);
        while let Some(at) = fire.filter(|at| *at < started_at && *at <= now) {
            missed += 1;
            if missed >= crate::limits::SCHEDULE_MISSED_COUNTED {
                break;
            }
            fire = spec.next_after(at);
        }
        let first_on_time = spec
            .next_after(Timestamp(started_at.0.saturating_sub(1)))
            .map(|at| at.max(due));
        let on_time = first_on_time.is_some_and(|at| at <= now);
        let wanted = on_time || (missed > 0 && self.catch_up == CatchUp::One);
        let skip = if !wanted {
            Some(format!(
                "{missed}{} fire(s) missed while the service was down (catch_up: none)",
                if missed >= crate::limits::SCHEDULE_MISSED_COUNTED {
                    " or more"
                } else {
                    ""
                }
            ))
        } else {
            previous_active
                .filter(|_| self.overlap == Overlap::Skip)
                .map(|run| format!("the previous run {run} is still in progress (overlap: skip)"))
        };
        Decision {
            start: skip.is_none(),
            missed,
            skip,
            next,
        }
    }

    /// Records a taken fire: the run it started, or why it started none.
    pub fn took(&mut self, decision: &Decision, now: Timestamp, started: Option<RunId>) {
        self.last_fire = Some(now);
        self.next_fire = decision.next;
        match started {
            Some(run) => {
                self.last_run = Some(run);
                self.runs_started += 1;
            }
            None => {
                self.fires_skipped += 1;
                let reason = decision
                    .skip
                    .clone()
                    .unwrap_or_else(|| "no run was started".to_string());
                self.last_skip = Some((now, reason));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        let time = chrono::DateTime::parse_from_rfc3339(text).expect("RFC 3339");
        Timestamp(u64::try_from(time.timestamp_millis()).expect("after 1970"))
    }

    fn schedule(spec: &Spec, cron: &str, created: Timestamp) -> Schedule {
        Schedule {
            name: "nightly".into(),
            cron: cron.into(),
            timezone: "UTC".into(),
            catch_up: CatchUp::One,
            overlap: Overlap::Allow,
            paused: false,
            created_at: created,
            next_fire: spec.next_after(created),
            last_fire: None,
            last_run: None,
            runs_started: 0,
            fires_skipped: 0,
            last_skip: None,
        }
    }

    /// Runs the schedule on an injected clock from `from` to `to`, ticking `tick_s`
    /// seconds as the driver's loop would wake, and returns the instants it started a
    /// run at.
    fn fires(cron: &str, zone: &str, from: &str, to: &str, tick_s: u64) -> Vec<Timestamp> {
        let spec = Spec::parse(cron, zone).expect("valid");
        let (from, to) = (at(from), at(to));
        let mut schedule = schedule(&spec, cron, from);
        let mut started = Vec::new();
        let mut now = from;
        while now <= to {
            if schedule.next_fire.is_some_and(|due| due <= now) {
                let decision = schedule.on_due(&spec, now, from, None);
                assert!(decision.start, "{decision:?}");
                started.push(now);
                schedule.took(&decision, now, Some(RunId(started.len() as u128)));
            }
            now = Timestamp(now.0 + tick_s * 1000);
        }
        started
    }

    #[test]
    fn a_0230_schedule_fires_once_on_the_spring_forward_day_at_the_end_of_the_gap() {
        // Europe/Berlin skips 02:00-03:00 on 2026-03-29.
        let started = fires(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-27T12:00:00Z",
            "2026-03-30T12:00:00Z",
            30,
        );
        assert_eq!(
            started,
            vec![
                at("2026-03-28T02:30:00+01:00"),
                at("2026-03-29T03:00:00+02:00"),
                at("2026-03-30T02:30:00+02:00"),
            ]
        );
    }

    #[test]
    fn a_0230_schedule_fires_once_on_the_fall_back_day_at_the_first_pass() {
        // Europe/Berlin repeats 02:00-03:00 on 2026-10-25.
        let started = fires(
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T00:00:00Z",
            "2026-10-26T12:00:00Z",
            30,
        );
        assert_eq!(
            started,
            vec![
                at("2026-10-24T02:30:00+02:00"),
                at("2026-10-25T02:30:00+02:00"),
                at("2026-10-26T02:30:00+01:00"),
            ]
        );
    }

    #[test]
    fn new_york_transitions_fire_a_0230_schedule_once_each_day() {
        // America/New_York: 2026-03-08 skips 02:00-03:00, 2026-11-01 repeats 01:00-02:00
        // (02:30 is not repeated there, so that day is an ordinary one for 02:30).
        let spring = fires(
            "30 2 * * *",
            "America/New_York",
            "2026-03-07T12:00:00Z",
            "2026-03-09T12:00:00Z",
            60,
        );
        assert_eq!(
            spring,
            vec![
                at("2026-03-08T03:00:00-04:00"),
                at("2026-03-09T02:30:00-04:00")
            ]
        );
        let autumn = fires(
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            "2026-11-02T12:00:00Z",
            60,
        );
        assert_eq!(
            autumn,
            vec![
                at("2026-11-01T01:30:00-04:00"),
                at("2026-11-02T01:30:00-05:00")
            ]
        );
    }

    #[test]
    fn an_interval_schedule_skips_the_missing_hour_and_fires_through_a_repeated_one() {
        let spring = fires(
            "0 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:30:00+01:00",
            "2026-03-29T04:30:00+02:00",
            60,
        );
        // 01:00 CET, then 03:00 and 04:00 CEST: 02:00 does not exist.
        assert_eq!(spring.len(), 3, "{spring:?}");
        let autumn = fires(
            "0 * * * *",
            "Europe/Berlin",
            "2026-10-25T00:30:00+02:00",
            "2026-10-25T03:30:00+01:00",
            60,
        );
        // 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET: every hour that passes.
        assert_eq!(
            autumn,
            vec![
                at("2026-10-25T01:00:00+02:00"),
                at("2026-10-25T02:00:00+02:00"),
                at("2026-10-25T02:00:00+01:00"),
                at("2026-10-25T03:00:00+01:00"),
            ]
        );
    }

    #[test]
    fn utc_schedules_fire_on_time_whatever_the_ticks() {
        let started = fires(
            "*/5 * * * * *",
            "UTC",
            "2026-12-04T10:00:00Z",
            "2026-12-04T10:01:00Z",
            1,
        );
        assert_eq!(started.len(), 12, "{started:?}");
        assert_eq!(started[0], at("2026-12-04T10:00:05Z"));
        // A loop that wakes late takes one fire, and the next is after the wake.
        let late = fires(
            "*/5 * * * * *",
            "UTC",
            "2026-12-04T10:00:00Z",
            "2026-12-04T10:01:00Z",
            7,
        );
        assert!(late.windows(2).all(|w| w[1].0 - w[0].0 >= 5000), "{late:?}");
    }

    fn missed_case(catch_up: CatchUp, overlap: Overlap, previous: Option<RunId>) -> Decision {
        // Due every minute from 10:00; the service was down from before 10:00 until 10:03:20.
        let spec = Spec::parse("* * * * *", "UTC").expect("valid");
        let mut schedule = schedule(&spec, "* * * * *", at("2026-12-04T09:59:30Z"));
        schedule.catch_up = catch_up;
        schedule.overlap = overlap;
        let started_at = at("2026-12-04T10:03:20Z");
        schedule.on_due(&spec, started_at, started_at, previous)
    }

    #[test]
    fn missed_fires_start_one_run_with_catch_up_one_and_none_with_none() {
        let one = missed_case(CatchUp::One, Overlap::Allow, None);
        assert_eq!((one.start, one.missed), (true, 4));
        assert_eq!(one.next, Some(at("2026-12-04T10:04:00Z")));
        let none = missed_case(CatchUp::None, Overlap::Allow, None);
        assert_eq!((none.start, none.missed), (false, 4));
        assert!(none.skip.unwrap().contains("4 fire(s) missed"));
        assert_eq!(none.next, Some(at("2026-12-04T10:04:00Z")));
    }

    #[test]
    fn a_fire_due_after_the_start_runs_even_with_catch_up_none() {
        let spec = Spec::parse("* * * * *", "UTC").expect("valid");
        let mut schedule = schedule(&spec, "* * * * *", at("2026-12-04T09:58:30Z"));
        schedule.catch_up = CatchUp::None;
        // Down over 09:59 and 10:00, up since 10:00:30, the loop takes 10:01 at 10:01:00.2.
        let decision = schedule.on_due(
            &spec,
            at("2026-12-04T10:01:00.200Z"),
            at("2026-12-04T10:00:30Z"),
            None,
        );
        assert_eq!((decision.start, decision.missed), (true, 2));
    }

    #[test]
    fn overlap_skip_starts_nothing_while_the_previous_run_is_in_progress() {
        let skipped = missed_case(CatchUp::One, Overlap::Skip, Some(RunId(7)));
        assert!(!skipped.start);
        assert!(skipped.skip.unwrap().contains("still in progress"));
        let allowed = missed_case(CatchUp::One, Overlap::Allow, Some(RunId(7)));
        assert!(allowed.start);
        let free = missed_case(CatchUp::One, Overlap::Skip, None);
        assert!(free.start);
    }

    #[test]
    fn took_moves_the_schedule_on_and_counts() {
        let spec = Spec::parse("0 2 * * *", "UTC").expect("valid");
        let mut schedule = schedule(&spec, "0 2 * * *", at("2026-12-04T00:00:00Z"));
        let now = at("2026-12-04T02:00:00Z");
        let decision = schedule.on_due(&spec, now, at("2026-12-04T00:00:00Z"), None);
        schedule.took(&decision, now, Some(RunId(1)));
        assert_eq!(schedule.next_fire, Some(at("2026-12-05T02:00:00Z")));
        assert_eq!(
            (schedule.runs_started, schedule.last_run),
            (1, Some(RunId(1)))
        );
        let skipped = Decision {
            start: false,
            missed: 0,
            skip: Some("why".into()),
            next: None,
        };
        schedule.took(&skipped, now, None);
        assert_eq!(schedule.fires_skipped, 1);
        assert_eq!(schedule.last_skip, Some((now, "why".to_string())));
    }

    #[test]
    fn bad_expressions_and_zones_are_named() {
        let error = Spec::parse("61 * * * *", "UTC").unwrap_err();
        assert_eq!(error.field, "cron");
        let error = Spec::parse("0 2 * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(error.field, "timezone");
        let error = Spec::parse("0 0 30 2 *", "UTC").unwrap_err();
        assert_eq!(error.field, "cron", "{error}");
        let error = Spec::parse(&"*".repeat(1000), "UTC").unwrap_err();
        assert_eq!(error.field, "cron");
        assert!(
            Spec::parse("0 30 2 * * *", "Europe/Berlin").is_ok(),
            "seconds first"
        );
    }
}
