// Package e2bsdk checks sandman's envd protocol against the official E2B
// SDK installed from npm: the SDK's generated code carries the protobuf
// descriptors of the services it calls, and sandman's must describe the
// same wire format.
package e2bsdk

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// fileDesc matches the SDK's embedded descriptors:
// `const file_process_process = ... fileDesc)("<base64>"`.
var fileDesc = regexp.MustCompile(`const (file_[a-z_]+) = [^\n]*?fileDesc\)\("([A-Za-z0-9+/=]+)"`)

// Descriptors reads the descriptors embedded in the SDK's bundle, by file
// name ("process/process.proto").
func Descriptors(sdkDir string) (map[string]*descriptorpb.FileDescriptorProto, error) {
	bundle := filepath.Join(sdkDir, "dist", "index.js")
	b, err := os.ReadFile(bundle)
	if err != nil {
		return nil, err
	}
	out := map[string]*descriptorpb.FileDescriptorProto{}
	for _, m := range fileDesc.FindAllSubmatch(b, -1) {
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(string(m[2]), "="))
		if err != nil {
			return nil, fmt.Errorf("%s in %s: %w", m[1], bundle, err)
		}
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			return nil, fmt.Errorf("%s in %s: %w", m[1], bundle, err)
		}
		out[fd.GetName()] = fd
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no protobuf descriptors found in %s (has the SDK's bundle changed shape?)", bundle)
	}
	return out, nil
}

// Compare reports where ours differs from the SDK's descriptor of the same
// file: package, messages (fields: name, number, label, type, type name,
// oneof, proto3 optional), enums and services (methods, their types and
// streaming). Options, comments and JSON names are not part of the wire
// format and are ignored.
func Compare(ours protoreflect.FileDescriptor, sdk *descriptorpb.FileDescriptorProto) error {
	a, b := wireOnly(protodesc.ToFileDescriptorProto(ours)), wireOnly(sdk)
	if proto.Equal(a, b) {
		return nil
	}
	// Name the parts that differ rather than print two whole files.
	var diffs []string
	parts := func(fd *descriptorpb.FileDescriptorProto) map[string]proto.Message {
		m := map[string]proto.Message{"(file)": &descriptorpb.FileDescriptorProto{Name: fd.Name, Package: fd.Package, Syntax: fd.Syntax}}
		for _, x := range fd.MessageType {
			m["message "+x.GetName()] = x
		}
		for _, x := range fd.EnumType {
			m["enum "+x.GetName()] = x
		}
		for _, x := range fd.Service {
			m["service "+x.GetName()] = x
		}
		return m
	}
	pa, pb := parts(a), parts(b)
	for k, x := range pa {
		if y, ok := pb[k]; !ok {
			diffs = append(diffs, k+": ours only")
		} else if !proto.Equal(x, y) {
			diffs = append(diffs, fmt.Sprintf("%s:\n  ours: %v\n  SDK:  %v", k, x, y))
		}
	}
	for k := range pb {
		if _, ok := pa[k]; !ok {
			diffs = append(diffs, k+": the SDK's only")
		}
	}
	slices.Sort(diffs)
	return fmt.Errorf("%s differs from the SDK's:\n%s", ours.Path(), strings.Join(diffs, "\n"))
}

func wireOnly(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	fd = proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	// The SDK's bundle lists imports apart from the descriptor.
	fd.Options, fd.SourceCodeInfo, fd.Dependency = nil, nil, nil
	var msgs func([]*descriptorpb.DescriptorProto)
	msgs = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			msgs(m.NestedType)
		}
	}
	msgs(fd.MessageType)
	for _, s := range fd.Service {
		s.Options = nil
		for _, m := range s.Method {
			m.Options = nil
			if !m.GetClientStreaming() {
				m.ClientStreaming = nil
			}
			if !m.GetServerStreaming() {
				m.ServerStreaming = nil
			}
		}
	}
	return fd
}
