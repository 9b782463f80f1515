//! Example programs live in this package; see the `[[example]]` targets.
