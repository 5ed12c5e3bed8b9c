#!/usr/bin/env bash
# Regenerates schemas/reason_codes.json from layerzero::ReasonCode (a test keeps them in sync).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q -p layerzero-cli --bin lz -- reason-codes --json > schemas/reason_codes.json
