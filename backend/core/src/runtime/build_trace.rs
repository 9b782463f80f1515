//! A timeline of the start-up work: NVRTC compiles, waits for a kernel, cuDNN plan builds
//! and restores, each with its thread and its start and duration. What a fresh process
//! spends before its first step is the sum along the thread that runs the program, so
//! [`build_events`] tells which build to move off that thread or to make cheaper.
//! Recording costs one short lock per build (builds take milliseconds to seconds); the
//! first [`MAX_EVENTS`] events are kept.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Events kept; later ones are counted in [`dropped_build_events`] only.
pub const MAX_EVENTS: usize = 4096;

/// What a [`BuildEvent`] timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildKind {
    /// NVRTC compiling one kernel unit.
    KernelCompile,
    /// A caller waiting for a kernel that was not loaded yet (its compile or disk read
    /// included, on this thread or another).
    KernelWait,
    /// cuDNN heuristics and plan finalization (runtime compilation included) for a new graph.
    PlanBuild,
    /// A plan restored from its serialized form (disk cache or a speculative build).
    PlanRestore,
    /// A caller waiting for a speculative build of the plan it needs.
    PlanWait,
}

/// One timed piece of start-up work.
#[derive(Clone, Debug)]
pub struct BuildEvent {
    /// What was timed.
    pub kind: BuildKind,
    /// The kernel name or the graph description.
    pub label: String,
    /// Name of the thread that did it (`main` for the program's main thread).
    pub thread: String,
    /// Start, in milliseconds since the first event of the process.
    pub start_ms: f64,
    /// Duration in milliseconds.
    pub ms: f64,
}

struct Trace {
    events: Vec<BuildEvent>,
    dropped: u64,
}

/// The build trace's part of the [`Engine`](crate::Engine): the timeline's origin and
/// its events.
pub(crate) struct BuildTrace {
    epoch: OnceLock<Instant>,
    trace: Mutex<Trace>,
}

impl BuildTrace {
    pub(crate) const fn new() -> Self {
        BuildTrace {
            epoch: OnceLock::new(),
            trace: Mutex::new(Trace {
                events: Vec::new(),
                dropped: 0,
            }),
        }
    }
}

fn epoch() -> Instant {
    *crate::engine().build_trace.epoch.get_or_init(Instant::now)
}

fn trace() -> &'static Mutex<Trace> {
    &crate::engine().build_trace.trace
}

/// Marks the start of the timeline (the first device open calls it); later calls do nothing.
pub(crate) fn start_clock() {
    epoch();
}

/// Records `kind` of `label`, which started at `start` and ends now.
pub(crate) fn record(kind: BuildKind, label: impl Into<String>, start: Instant) {
    let end = Instant::now();
    let origin = epoch();
    let event = BuildEvent {
        kind,
        label: label.into(),
        thread: std::thread::current().name().unwrap_or("unnamed").to_owned(),
        start_ms: start.saturating_duration_since(origin).as_secs_f64() * 1e3,
        ms: end.saturating_duration_since(start).as_secs_f64() * 1e3,
    };
    let mut t = trace().lock().unwrap_or_else(|e| e.into_inner());
    if t.events.len() < MAX_EVENTS {
        t.events.push(event);
    } else {
        t.dropped += 1;
    }
}

/// The events so far, in the order they ended.
pub fn build_events() -> Vec<BuildEvent> {
    trace().lock().unwrap_or_else(|e| e.into_inner()).events.clone()
}

/// Events not kept because [`MAX_EVENTS`] were already recorded.
pub fn dropped_build_events() -> u64 {
    trace().lock().unwrap_or_else(|e| e.into_inner()).dropped
}

/// Total milliseconds of `kind` spent on the thread named `thread`.
pub fn thread_ms(events: &[BuildEvent], kind: BuildKind, thread: &str) -> f64 {
    events
        .iter()
        .filter(|e| e.kind == kind && e.thread == thread)
        .map(|e| e.ms)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_their_thread_and_duration() {
        let start = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        std::thread::Builder::new()
            .name("trace-test".into())
            .spawn(move || record(BuildKind::PlanBuild, "graph[x]", start))
            .unwrap()
            .join()
            .unwrap();
        let events = build_events();
        let e = events.iter().find(|e| e.label == "graph[x]").expect("recorded");
        assert_eq!((e.kind, e.thread.as_str()), (BuildKind::PlanBuild, "trace-test"));
        assert!(e.ms >= 2.0 && e.start_ms >= 0.0, "{e:?}");
        assert!(thread_ms(&events, BuildKind::PlanBuild, "trace-test") >= 2.0);
        assert_eq!(thread_ms(&events, BuildKind::KernelWait, "trace-test"), 0.0);
    }
}
