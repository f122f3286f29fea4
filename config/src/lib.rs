//! layad's configuration schema: one TOML file layered under `LAYAD_*` environment overrides.
//! Empty until the supervisor issue fills it in; it exists so the workspace layout is final.
