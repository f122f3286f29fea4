//! The Core ML engine for the Apple Neural Engine: fixed-shape bucketed graphs plus host-side inputs.
//! Empty until the Neural Engine issue fills it in; it exists so the workspace layout is final.
