# runrecordd — `make run` sets up, builds and walks the main job;
# `make test` runs every suite; `make lint` is gofmt, go vet and staticcheck.
GO      ?= go
BIN     := bin/runrecordd
PKGS    := ./...

.PHONY: all setup build run test unit lint conformance fuzz bench clean

all: build

# Installs containerd, runc, iptables and a CRIU that passes `criu check`
# (docs/setup.md). Idempotent; needs root.
setup:
	bash deploy/setup.sh

# The binary and the demo units: static Go programs packed as OCI image
# archives (bin/units/NAME.tar, image runrecordd.local/NAME:1).
UNITS := oracle ballast agent poller

build:
	$(GO) build -o $(BIN) ./cmd/runrecordd
	@for u in $(UNITS); do \
		$(GO) run ./cmd/mkunit -o bin/units/$$u.tar -name runrecordd.local/$$u:1 ./units/$$u >/dev/null || exit 1; \
	done

# Conformance, then the daemon on its embedded default walking one unit
# through run -> park -> resume -> verify (deploy/walk.sh).
run: setup build
	./$(BIN) conformance
	bash deploy/walk.sh bin

test: setup lint unit conformance

# test/e2e first: go test starts packages in the order given, two at a
# time on two cores, and the end-to-end package is the longest by far.
# Listed last (its place in ./...) it started once nearly every other
# package had run, and the step took their time plus its own; listed
# first it runs beside them (docs/benchmarks.md, "Test time").
unit:
	$(GO) test -race -count=1 ./test/e2e/ $(PKGS)

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

bench:
	bench/record.sh

clean:
	rm -rf bin
