//! End-to-end tests of Herald live in `tests/tests/`; they start the same
//! wiring the `herald` binary runs, against real databases and brokers.
