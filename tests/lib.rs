//! Nothing to export: this package only holds the end-to-end test binary in `e2e/`.
