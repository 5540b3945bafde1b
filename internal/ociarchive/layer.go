package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
	"path"
	"sort"
)

// layer is the uncompressed layer tar: directories first (parents before
// children), then files, each group sorted by path.
func layer(img Image) ([]byte, error) {
	dirs := map[string]fs.FileMode{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for d, mode := range img.Dirs {
		d = path.Clean("/" + d)
		if d == "/" {
			continue
		}
		dirs[d] = mode
		addParents(d)
	}
	files := map[string]File{}
	for _, f := range img.Files {
		p := path.Clean("/" + f.Path)
		if p == "/" {
			return nil, fmt.Errorf("file with empty path")
		}
		if _, dup := files[p]; dup {
			return nil, fmt.Errorf("file %s twice", p)
		}
		if _, isDir := dirs[p]; isDir {
			return nil, fmt.Errorf("%s is both a file and a directory", p)
		}
		f.Path = p
		files[p] = f
		addParents(p)
	}
	dirNames := make([]string, 0, len(dirs))
	for d := range dirs {
		if _, isFile := files[d]; isFile {
			return nil, fmt.Errorf("%s is both a file and a directory", d)
		}
		dirNames = append(dirNames, d)
	}
	sort.Strings(dirNames)
	fileNames := make([]string, 0, len(files))
	for p := range files {
		fileNames = append(fileNames, p)
	}
	sort.Strings(fileNames)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirNames {
		if err := tw.WriteHeader(dirHeader(d[1:]+"/", dirs[d])); err != nil {
			return nil, err
		}
	}
	for _, p := range fileNames {
		f := files[p]
		if err := tw.WriteHeader(fileHeader(p[1:], f.Mode, int64(len(f.Data)))); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarMode converts permission, setuid, setgid and sticky bits to tar's.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func dirHeader(name string, mode fs.FileMode) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeDir,
		Name:     name,
		Mode:     tarMode(mode),
		ModTime:  Epoch,
		Format:   tar.FormatPAX,
	}
}

func fileHeader(name string, mode fs.FileMode, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     tarMode(mode),
		Size:     size,
		ModTime:  Epoch,
		Format:   tar.FormatPAX,
	}
}

func gzipped(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	// The header's ModTime stays zero and Name empty: nothing varies.
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
