// k8s-validate checks Prometheus Operator resources (ServiceMonitor, PodMonitor, Probe,
// PrometheusRule) against the operator's published Go API types, as the API server would:
// every document is decoded strictly into its typed struct (an unknown or misspelt field, a
// duplicate key or a value of the wrong type is an error), and every duration field must parse
// with Prometheus' own duration parser (the types' documented contract).
//
//	k8s-validate [FILE...]        (no FILE or "-": standard input; YAML or JSON, "---" separated)
//	k8s-validate -kustomize DIR   (print what kustomize renders from DIR, with kustomize's own
//	                               library: what `kubectl kustomize DIR` prints)
//
// Prints "ok KIND NAME" or "invalid: FILE: document N (KIND NAME): REASON" per document; exits 0
// when all are valid, 1 when one is not, 2 when a file cannot be read (or DIR not rendered).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The kinds this validates, by apiVersion and kind: a new typed value of each.
var kinds = map[string]func() interface{}{
	"monitoring.coreos.com/v1/ServiceMonitor": func() interface{} { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() interface{} { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/Probe":          func() interface{} { return &monitoringv1.Probe{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() interface{} { return &monitoringv1.PrometheusRule{} },
}

var durationType = reflect.TypeOf(monitoringv1.Duration(""))

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-kustomize" {
		out, err := kustomize(os.Args[2])
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-validate: kustomize %s: %v\n", os.Args[2], err)
			os.Exit(2)
		}
		os.Stdout.Write(out)
		return
	}
	files := os.Args[1:]
	if len(files) == 0 {
		files = []string{"-"}
	}
	invalid := false
	for _, name := range files {
		var r io.Reader = os.Stdin
		if name != "-" {
			f, err := os.Open(name)
			if err != nil {
				fmt.Fprintf(os.Stderr, "k8s-validate: %v\n", err)
				os.Exit(2)
			}
			defer f.Close()
			r = f
		}
		ok, err := validateStream(name, r)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8s-validate: %s: %v\n", name, err)
			os.Exit(2)
		}
		invalid = invalid || !ok
	}
	if invalid {
		os.Exit(1)
	}
}

// validateStream validates every document of r; false when one is invalid.
func validateStream(name string, r io.Reader) (bool, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	allOK := true
	for n := 1; ; n++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return allOK, nil
		}
		if err != nil {
			return false, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			n--
			continue
		}
		kind, objName, err := validate(doc)
		if err != nil {
			allOK = false
			fmt.Printf("invalid: %s: document %d (%s %s): %v\n", name, n, kind, objName, err)
		} else {
			fmt.Printf("ok %s %s\n", kind, objName)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// validate decodes one document strictly into its kind's type; returns its kind and name.
func validate(doc []byte) (string, string, error) {
	// YAMLToJSONStrict rejects duplicate keys, which a lenient parser silently resolves.
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "?", "?", fmt.Errorf("not YAML/JSON: %v", err)
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &head); err != nil {
		return "?", "?", fmt.Errorf("not an object with apiVersion, kind and metadata: %v", err)
	}
	newObj, known := kinds[head.APIVersion+"/"+head.Kind]
	if !known {
		return head.Kind, head.Metadata.Name, fmt.Errorf("apiVersion %q kind %q is not a Prometheus Operator kind this checks (expected one of %s)",
			head.APIVersion, head.Kind, knownKinds())
	}
	if head.Metadata.Name == "" {
		return head.Kind, "", errors.New("metadata.name is missing")
	}
	obj := newObj()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return head.Kind, head.Metadata.Name, err
	}
	if err := checkDurations(reflect.ValueOf(obj), ""); err != nil {
		return head.Kind, head.Metadata.Name, err
	}
	return head.Kind, head.Metadata.Name, nil
}

func knownKinds() string {
	var names []string
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// kustomize renders dir as `kubectl kustomize dir` does (kustomize's default options).
func kustomize(dir string) ([]byte, error) {
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return resources.AsYaml()
}

// checkDurations walks the decoded value: every monitoringv1.Duration must be a Prometheus
// duration (model.ParseDuration: "15s", "1h30m"; not "15 seconds").
func checkDurations(v reflect.Value, path string) error {
	switch v.Kind() {
	case reflect.Ptr, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkDurations(v.Elem(), path)
	case reflect.Struct:
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.PkgPath != "" { // unexported
				continue
			}
			name := strings.Split(f.Tag.Get("json"), ",")[0]
			sub := path
			if name != "" && name != "-" {
				sub = strings.TrimPrefix(path+"."+name, ".")
			}
			if err := checkDurations(v.Field(i), sub); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len(); i++ {
			if err := checkDurations(v.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			if err := checkDurations(iter.Value(), fmt.Sprintf("%s[%v]", path, iter.Key())); err != nil {
				return err
			}
		}
	case reflect.String:
		if v.Type() == durationType && v.String() != "" {
			if _, err := model.ParseDuration(v.String()); err != nil {
				return fmt.Errorf("%s: %q is not a duration (e.g. 30s, 1m, 1h20m15s): %v", path, v.String(), err)
			}
		}
	}
	return nil
}
