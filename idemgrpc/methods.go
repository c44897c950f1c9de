package idemgrpc

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// method is a guarded (or keyed) unary method, resolved at setup.
type method struct {
	name  string                   // full method name, "/pkg.Service/Method"
	reply protoreflect.MessageType // the response type, to rebuild a stored response from
}

// resolveMethods turns Methods and ExceptMethods into the set of unary methods they name, looked
// up in the protobuf registry, where generated code registers every service it defines. Looking
// them up is what lets setup refuse a streaming method and a typo, and what gives the server the
// response type it rebuilds a replay from without running the handler.
func resolveMethods(include, exclude []string) (map[string]*method, error) {
	if len(include) == 0 {
		return nil, errors.New("idemgrpc: Methods cannot be empty: name the unary methods to make safe to retry, by full name, such as \"/bank.v1.Bank/Transfer\", or all of a service's as \"/bank.v1.Bank/*\"")
	}
	excluded := make(map[string]bool, len(exclude))
	for _, name := range exclude {
		if _, _, err := parseMethodName("ExceptMethods", name, false); err != nil {
			return nil, err
		}
		excluded[name] = true
	}

	out := make(map[string]*method)
	var streaming []string
	for _, name := range include {
		svc, mname, err := parseMethodName("Methods", name, true)
		if err != nil {
			return nil, err
		}
		sd, err := findService("Methods", name, svc)
		if err != nil {
			return nil, err
		}
		var mds []protoreflect.MethodDescriptor
		if mname == "*" {
			for i := 0; i < sd.Methods().Len(); i++ {
				mds = append(mds, sd.Methods().Get(i))
			}
		} else {
			md := sd.Methods().ByName(protoreflect.Name(mname))
			if md == nil {
				return nil, fmt.Errorf("idemgrpc: Methods names %q, but service %s has no method %s", name, svc, mname)
			}
			mds = append(mds, md)
		}
		for _, md := range mds {
			full := "/" + svc + "/" + string(md.Name())
			if excluded[full] {
				continue
			}
			if md.IsStreamingClient() || md.IsStreamingServer() {
				streaming = append(streaming, full)
				continue
			}
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
			if err != nil {
				return nil, fmt.Errorf("idemgrpc: Methods names %q, whose response type %s is not registered: import the package generated for it", full, md.Output().FullName())
			}
			out[full] = &method{name: full, reply: mt}
		}
	}
	if len(streaming) > 0 {
		sort.Strings(streaming)
		return nil, fmt.Errorf("idemgrpc: Methods cannot include streaming methods (%s): a stream's responses reach the client before the transaction commits, so they cannot be stored and replayed; guard unary methods only, or leave these out with ExceptMethods", strings.Join(streaming, ", "))
	}
	for name := range excluded {
		if !coveredBy(include, name) {
			return nil, fmt.Errorf("idemgrpc: ExceptMethods names %q, which Methods does not include", name)
		}
	}
	return out, nil
}

// parseMethodName splits a full method name, "/pkg.Service/Method", into service and method.
// With wildcard, the method may be "*".
func parseMethodName(field, name string, wildcard bool) (svc, mname string, err error) {
	rest, ok := strings.CutPrefix(name, "/")
	if ok {
		svc, mname, ok = strings.Cut(rest, "/")
	}
	if !ok || svc == "" || mname == "" || strings.Contains(mname, "/") ||
		!protoreflect.FullName(svc).IsValid() ||
		(mname != "*" || !wildcard) && !protoreflect.Name(mname).IsValid() {
		form := `"/package.Service/Method"`
		if wildcard {
			form += ` or "/package.Service/*"`
		}
		return "", "", fmt.Errorf("idemgrpc: %s must hold full method names of the form %s (got %q)", field, form, name)
	}
	return svc, mname, nil
}

func findService(field, name, svc string) (protoreflect.ServiceDescriptor, error) {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: %s names %q, but no service %s is registered: import the package generated for it (its init registers the service)", field, name, svc)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: %s names %q, but %s is not a service", field, name, svc)
	}
	return sd, nil
}

// coveredBy reports whether name is one of the methods that include names.
func coveredBy(include []string, name string) bool {
	svc, _, _ := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	for _, inc := range include {
		if inc == name || inc == "/"+svc+"/*" {
			return true
		}
	}
	return false
}
