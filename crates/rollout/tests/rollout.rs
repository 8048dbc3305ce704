//! Properties of the canary state machine over random outcome and measurement sequences.

use fleet_policy::PolicySpec;
use fleet_rollout::{Action, Canary, CanaryPlan, Guards, Phase, PushOutcome, SideWindow};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Event {
    Observe { advance_ms: u64, canary: SideWindow, baseline: SideWindow },
    Outcome { refuse: bool },
    Abort,
}

fn side() -> impl Strategy<Value = SideWindow> {
    (0u64..200, 0u64..30, proptest::option::of(0.01f64..2.0), proptest::option::of(0.0f64..1.0)).prop_map(
        |(requests, errors, ttft_p95_s, hit_rate)| SideWindow {
            requests,
            errors: errors.min(requests),
            ttft_p95_s,
            hit_rate,
        },
    )
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (0u64..800, side(), side())
            .prop_map(|(advance_ms, canary, baseline)| Event::Observe { advance_ms, canary, baseline }),
        3 => any::<bool>().prop_map(|refuse| Event::Outcome { refuse }),
        1 => Just(Event::Abort),
    ]
}

fn answer(routers: &[String], refuse: bool) -> Vec<(String, PushOutcome)> {
    routers
        .iter()
        .enumerate()
        .map(|(i, router)| {
            let outcome = if refuse && i == 0 {
                PushOutcome::Unreachable { error: "connection refused".into() }
            } else {
                PushOutcome::Applied { version: 7 }
            };
            (router.clone(), outcome)
        })
        .collect()
}

fn crosses(guards: &Guards, canary: &SideWindow, baseline: &SideWindow) -> bool {
    let slow = matches!((canary.ttft_p95_s, baseline.ttft_p95_s),
        (Some(c), Some(b)) if b > 0.0 && c > guards.max_ttft_p95_ratio * b
            && (c - b) * 1e3 >= guards.min_ttft_p95_increase_ms);
    let cold = matches!((canary.hit_rate, baseline.hit_rate),
        (Some(c), Some(b)) if b - c > guards.max_hit_rate_drop);
    let rate =
        |side: &SideWindow| if side.requests == 0 { 0.0 } else { side.errors as f64 / side.requests as f64 };
    let failing = rate(canary) > guards.max_error_rate_ratio * rate(baseline)
        && rate(canary) - rate(baseline) >= guards.min_error_rate_increase;
    slow || cold || failing
}

/// Every guard has its figures on both sides (anything less is "not enough data").
fn complete(canary: &SideWindow, baseline: &SideWindow) -> bool {
    [canary, baseline].iter().all(|side| side.ttft_p95_s.is_some() && side.hit_rate.is_some())
}

proptest! {
    #[test]
    fn promotion_needs_held_guards_and_rollbacks_touch_only_canaries(events in proptest::collection::vec(event(), 1..60)) {
        let plan = CanaryPlan {
            candidate: PolicySpec::named("least_load"),
            canary: vec!["a".into(), "b".into()],
            baseline: vec!["c".into()],
            observe_ms: 1_000,
            guards: Guards::default(),
        };
        let guards = plan.guards.clone();
        let (mut canary, mut pending) = Canary::start(plan, 0).unwrap();
        let mut now = 0;
        let mut observing_since = None;
        for event in events {
            let next = match (&pending, event) {
                (Action::Push { routers, .. }, Event::Outcome { refuse }) => canary.on_push_outcomes(&answer(routers, refuse), now),
                (Action::Rollback { routers }, Event::Outcome { refuse }) => canary.on_rollback_outcomes(&answer(routers, refuse), now),
                (Action::Observe, Event::Observe { advance_ms, canary: c, baseline: b }) => {
                    now += advance_ms;
                    let judged = c.requests >= guards.min_requests && b.requests >= guards.min_requests;
                    let action = canary.on_observation(&c, &b, now);
                    if let Action::Push { routers, .. } = &action {
                        // Promotion: judged, within the guards, after the whole observation time.
                        prop_assert_eq!(routers, &vec!["c".to_string()]);
                        prop_assert!(judged && !crosses(&guards, &c, &b));
                        prop_assert!(complete(&c, &b), "promoted without every guard judged: {:?} {:?}", c, b);
                        prop_assert!(now - observing_since.unwrap() >= 1_000);
                    }
                    if judged && crosses(&guards, &c, &b) {
                        prop_assert!(matches!(action, Action::Rollback { .. }), "{:?}", action);
                    }
                    action
                }
                (_, Event::Abort) => canary.abort("test", now),
                (_, _) => continue,
            };
            if let Phase::Observing { since_ms } = canary.phase() {
                observing_since = Some(*since_ms);
            }
            if let Action::Rollback { routers } = &next {
                prop_assert!(routers.iter().all(|r| r == "a" || r == "b"), "{:?}", routers);
            }
            if matches!(canary.phase(), Phase::RolledBack { .. }) {
                prop_assert!(canary.applied().is_empty());
            }
            if canary.phase().is_terminal() {
                prop_assert_eq!(&next, &Action::Finished);
                prop_assert_eq!(canary.abort("again", now), Action::Finished);
                break;
            }
            pending = next;
        }
        prop_assert!(!canary.log().is_empty());
    }
}
