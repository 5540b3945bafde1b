module github.com/runrecordd/runrecordd

go 1.26.6

require (
	github.com/rogpeppe/go-internal v1.16.0
	golang.org/x/sys v0.48.0
	lukechampine.com/blake3 v1.4.1
)

require (
	github.com/BurntSushi/toml v1.4.1-0.20240526193622-a339e1f7089c // indirect
	github.com/checkpoint-restore/go-criu/v7 v7.2.0 // indirect
	github.com/containerd/containerd/v2 v2.4.2 // indirect
	github.com/klauspost/cpuid/v2 v2.0.9 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/exp/typeparams v0.0.0-20231108232855-2478ac86f678 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/tools v0.51.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	honnef.co/go/tools v0.8.2 // indirect
)

tool honnef.co/go/tools/cmd/staticcheck
