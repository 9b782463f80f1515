//! `register()` without a GPU: the registry accepts the provider once (nothing touches a
//! device until a claimed operation runs), and a second call is a typed error. Its own test
//! binary: registering is process-wide.

use cudnn_burn::{register, stats, Error, Stats};

#[test]
fn register_once_then_already_registered() {
    assert_eq!(stats(), None, "nothing registered yet");
    register().expect("the first registration succeeds without a GPU");
    assert_eq!(stats(), Some(Stats::default()), "no operation ran");
    match register() {
        Err(Error::AlreadyRegistered) => {}
        other => panic!("second register(): {other:?}"),
    }
    assert!(Error::AlreadyRegistered.to_string().contains("already registered"));
}
