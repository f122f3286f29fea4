//! The worker gRPC protocol and the serving harness every worker binary shares.
//! Empty until the worker-process issue fills it in; it exists so the workspace layout is final.
