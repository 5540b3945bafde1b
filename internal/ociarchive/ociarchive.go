// Package ociarchive writes single-layer OCI image archives in pure Go and
// builds the static Go programs that go in them.
//
// An archive is a tar stream of an OCI image layout (oci-layout, index.json,
// blobs/sha256/…) holding one linux/amd64 image: one gzip-compressed layer
// tar, a config with the entrypoint, and a manifest. containerd's Import reads
// it as it reads any `oci-archive`.
//
// # Determinism
//
// Every timestamp in both tars and in the gzip header is fixed to [Epoch],
// owners are 0:0, entries are sorted by path, and the JSON documents are
// encoded from structs (fixed field order). The same [Image] therefore always
// yields the same bytes, so the same manifest digest: an image digest recorded
// in an environment manifest stays stable across rebuilds. [GoBinary] builds
// with -trimpath and without VCS stamping so that, for one toolchain and one
// source tree, the program bytes are stable too.
package ociarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// Epoch is the modification time of every entry the package writes.
var Epoch = time.Unix(0, 0).UTC()

// AnnotationImageName is the index annotation containerd's importer turns
// into an image name (containerd's images.AnnotationImageName).
const AnnotationImageName = "io.containerd.image.name"

// UnitPath is where [Unit] places the program inside the image.
const UnitPath = "/unit"

// File is one regular file in the image's layer.
type File struct {
	// Path is absolute inside the image, e.g. "/unit".
	Path string
	// Mode holds the permission bits (0o755 for a program).
	Mode fs.FileMode
	Data []byte
}

// Image is what goes into an archive.
type Image struct {
	// Name is the full reference containerd gives the imported image
	// ("runrecordd.local/oracle:1"); its tag part becomes the OCI ref name.
	Name string
	// Files are the layer's regular files; parent directories are
	// created (0755) as needed.
	Files []File
	// Dirs are extra empty directories with their modes, e.g. "/tmp": 01777.
	Dirs map[string]fs.FileMode
	// Entrypoint, Cmd, Env, WorkingDir and User fill the image config.
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
}

// Digests names the blobs of a written archive.
type Digests struct {
	// Manifest is the image manifest's digest: the image's identity.
	Manifest digest.Digest
	// Config is the config blob's digest (the image ID in docker's terms).
	Config digest.Digest
	// Layer is the compressed layer's digest; DiffID the uncompressed one.
	Layer  digest.Digest
	DiffID digest.Digest
}

// Unit is the image of one static program at [UnitPath], run as the
// entrypoint, with a world-writable /tmp.
func Unit(name string, program []byte) Image {
	return Image{
		Name:       name,
		Files:      []File{{Path: UnitPath, Mode: 0o755, Data: program}},
		Dirs:       map[string]fs.FileMode{"/tmp": fs.ModeSticky | 0o777},
		Entrypoint: []string{UnitPath},
		Env:        []string{"PATH=/"},
		WorkingDir: "/",
	}
}

type blob struct {
	desc ocispec.Descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{
		desc: ocispec.Descriptor{
			MediaType: mediaType,
			Digest:    digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(sum[:])),
			Size:      int64(len(data)),
		},
		data: data,
	}
}

// Write writes img as an OCI archive to w.
func Write(w io.Writer, img Image) (Digests, error) {
	if img.Name == "" {
		return Digests{}, errors.New("ociarchive: image has no name")
	}
	layerBlob, diffID, err := layerOf(img)
	if err != nil {
		return Digests{}, err
	}
	configBlob, err := configOf(img, diffID)
	if err != nil {
		return Digests{}, err
	}
	manifestBlob, err := manifestOf(img, configBlob, layerBlob)
	if err != nil {
		return Digests{}, err
	}
	top, err := layoutEntries(img, manifestBlob)
	if err != nil {
		return Digests{}, err
	}
	if err := writeArchive(w, top, []blob{configBlob, layerBlob, manifestBlob}); err != nil {
		return Digests{}, fmt.Errorf("ociarchive: write %s: %w", img.Name, err)
	}
	return Digests{
		Manifest: manifestBlob.desc.Digest,
		Config:   configBlob.desc.Digest,
		Layer:    layerBlob.desc.Digest,
		DiffID:   diffID,
	}, nil
}

// layerOf is img's one layer, gzipped, and its diff ID: the digest of the
// uncompressed tar, which the config names.
func layerOf(img Image) (blob, digest.Digest, error) {
	layerTar, err := layer(img)
	if err != nil {
		return blob{}, "", fmt.Errorf("ociarchive: layer of %s: %w", img.Name, err)
	}
	diffID := digest.FromBytes(layerTar)
	gz, err := gzipped(layerTar)
	if err != nil {
		return blob{}, "", fmt.Errorf("ociarchive: compress layer of %s: %w", img.Name, err)
	}
	return newBlob(ocispec.MediaTypeImageLayerGzip, gz), diffID, nil
}

// configOf is img's config: linux/amd64, its entrypoint, command,
// environment and working directory, over the one layer diffID.
func configOf(img Image, diffID digest.Digest) (blob, error) {
	config := ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config: ocispec.ImageConfig{
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			Env:        img.Env,
			WorkingDir: img.WorkingDir,
			User:       img.User,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return blob{}, fmt.Errorf("ociarchive: config of %s: %w", img.Name, err)
	}
	return newBlob(ocispec.MediaTypeImageConfig, configJSON), nil
}

// manifestOf is the image manifest of config and layer.
func manifestOf(img Image, config, layer blob) (blob, error) {
	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config.desc,
		Layers:    []ocispec.Descriptor{layer.desc},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return blob{}, fmt.Errorf("ociarchive: manifest of %s: %w", img.Name, err)
	}
	return newBlob(ocispec.MediaTypeImageManifest, manifestJSON), nil
}

// entry is one file of the archive.
type entry struct {
	name string
	data []byte
}

// layoutEntries are the archive's top-level files: oci-layout, then
// index.json naming manifest under img's name, as containerd's Import
// reads it.
func layoutEntries(img Image, manifest blob) ([]entry, error) {
	mdesc := manifest.desc
	mdesc.Platform = &ocispec.Platform{Architecture: "amd64", OS: "linux"}
	mdesc.Annotations = map[string]string{
		AnnotationImageName:       img.Name,
		ocispec.AnnotationRefName: refName(img.Name),
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{mdesc},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return nil, fmt.Errorf("ociarchive: index of %s: %w", img.Name, err)
	}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return nil, fmt.Errorf("ociarchive: layout of %s: %w", img.Name, err)
	}
	return []entry{{ocispec.ImageLayoutFile, layoutJSON}, {"index.json", indexJSON}}, nil
}

// writeArchive writes the archive's tar to w: the blob directories, the
// top-level entries, then the blobs in digest order, so that one image
// always gives the same bytes.
func writeArchive(w io.Writer, top []entry, blobs []blob) error {
	tw := tar.NewWriter(w)
	entries := top
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].desc.Digest < blobs[j].desc.Digest })
	for _, b := range blobs {
		entries = append(entries, entry{"blobs/sha256/" + b.desc.Digest.Encoded(), b.data})
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(dirHeader(dir, 0o755)); err != nil {
			return err
		}
	}
	for _, e := range entries {
		if err := tw.WriteHeader(fileHeader(e.name, 0o644, int64(len(e.data)))); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// WriteFile writes img as an OCI archive at path, durably, mode 0644
// ([atomicfile.Write]): a crash leaves either the old archive or the whole
// new one.
func WriteFile(path string, img Image) (Digests, error) {
	var d Digests
	err := atomicfile.Write(path, 0o644, func(f *os.File) (err error) {
		d, err = Write(f, img)
		return err
	})
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: write %s: %w", path, err)
	}
	return d, nil
}

// refName is the tag of a reference ("latest" when it has none), the form
// the OCI ref.name annotation takes in archives written by containerd.
func refName(name string) string {
	if i := strings.LastIndexAny(name, ":/"); i >= 0 && name[i] == ':' {
		return name[i+1:]
	}
	return "latest"
}

// GoBinary builds the Go main package pkg (an import path or a ./relative
// path, resolved in dir) as a static linux/amd64 program and returns its
// bytes: CGO_ENABLED=0, -trimpath, -buildvcs=false, symbol tables stripped.
func GoBinary(ctx context.Context, dir, pkg string) ([]byte, error) {
	out, err := os.MkdirTemp("", "ociarchive-build-")
	if err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w", pkg, err)
	}
	defer os.RemoveAll(out)
	bin := filepath.Join(out, "unit")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid=", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w: %s", pkg, err, bytes.TrimSpace(msg))
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w", pkg, err)
	}
	return data, nil
}
