//! Compiles `worker.proto` into Rust with protox (a protobuf compiler written in Rust) and
//! tonic-prost-build's `compile_fds`, so no `protoc` binary is needed on any machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=worker.proto");
    let descriptors = protox::compile(["worker.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
