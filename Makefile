# runrecordd — `make run` sets up, builds and walks the main job;
# `make test` runs every suite; `make lint` is gofmt, go vet and staticcheck.
GO      ?= go
BIN     := bin/runrecordd
PKGS    := ./...

.PHONY: all setup build run test unit lint conformance fuzz bench clean

all: build

# Builds containerd and runc (deploy/runtime), installs iptables and a CRIU
# that passes `criu check` (docs/setup.md). Idempotent; needs root.
setup:
	bash deploy/setup.sh

# The binary, the gate warm sandboxes start in (beside it, statically
# linked: docs/warm-pool.md), and the demo units: static Go programs
# packed as OCI image archives (bin/units/NAME.tar, image
# runrecordd.local/NAME:1).
UNITS := oracle ballast agent poller

build:
	$(GO) build -o $(BIN) ./cmd/runrecordd
	CGO_ENABLED=0 $(GO) build -o bin/runrecordd-gate ./cmd/runrecordd-gate
	@for u in $(UNITS); do \
		$(GO) run ./cmd/mkunit -o bin/units/$$u.tar -name runrecordd.local/$$u:1 ./units/$$u >/dev/null || exit 1; \
	done

# Conformance, then the daemon on its embedded default walking one unit
# through run -> park -> resume -> verify (deploy/walk.sh).
run: setup build
	./$(BIN) conformance
	bash deploy/walk.sh bin

test: setup lint unit conformance

# The longest packages first: go test starts packages in the order given
# (each once). test/e2e, the longest by far, runs beside all the others;
# internal/store (30-60 s), in its place in ./..., started among the last
# and ended the step alone. Three at a time on two cores (-p 3): the
# packages mostly wait (on containerd, CRIU, etcd leases), and with two
# the step used one core in two (docs/benchmarks.md, "Test time").
# -timeout: test/e2e took 650 s on an AMD machine (2026-12-05), past go
# test's default of 10 minutes per package; CI's own budget is 30.
unit:
	$(GO) test -race -count=1 -p 3 -timeout 25m ./test/e2e/ ./internal/store/ $(PKGS)

conformance: build
	./$(BIN) conformance

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) tool staticcheck $(PKGS)

# Short fuzzing runs of every decoder; lengthen with FUZZTIME=10m.
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run XXX -fuzz FuzzDecodeWire -fuzztime $(FUZZTIME) ./pkg/record
	$(GO) test -run XXX -fuzz FuzzDecodeSegment -fuzztime $(FUZZTIME) ./pkg/record
	$(GO) test -run XXX -fuzz FuzzAttestation -fuzztime $(FUZZTIME) ./pkg/attest
	# CRIU images: seeds of up to 16 KiB; each new input minimized a
	# little, or minimizing takes the whole run.
	$(GO) test -run XXX -fuzz FuzzDecodeImages -fuzztime $(FUZZTIME) -fuzzminimizetime 10x ./internal/criu

bench:
	bench/record.sh

clean:
	rm -rf bin
