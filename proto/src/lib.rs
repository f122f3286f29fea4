//! The worker protocol: the engine trait every worker implements, and (with the worker-process
//! issue) `worker.proto`, its generated tonic code, the gRPC client and the serving harness.

pub mod engine;

pub use engine::{Engine, EngineError, EngineInfo, EngineOutput, EngineRow, LoadedCheckpoint};
