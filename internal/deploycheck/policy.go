package deploycheck

import (
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// policy is a ValidatingAdmissionPolicy or its binding, the fields the
// guard rests on; decoded strictly, so a misspelt field is an error.
type policy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		FailurePolicy    string   `json:"failurePolicy"`
		PolicyName       string   `json:"policyName"`
		ValidationAction []string `json:"validationActions"`
		MatchConstraints struct {
			ResourceRules []struct {
				APIGroups   []string `json:"apiGroups"`
				APIVersions []string `json:"apiVersions"`
				Operations  []string `json:"operations"`
				Resources   []string `json:"resources"`
			} `json:"resourceRules"`
		} `json:"matchConstraints"`
		Variables []struct {
			Name       string `json:"name"`
			Expression string `json:"expression"`
		} `json:"variables"`
		Validations []struct {
			Expression        string `json:"expression"`
			MessageExpression string `json:"messageExpression"`
			Reason            string `json:"reason"`
		} `json:"validations"`
	} `json:"spec"`
}

// CheckLocalNamesPolicy holds the local-names guard among docs to its
// shape: a policy for pods and one for pod templates, each bound with
// Deny, failing closed, matching what they must, and testing prefix (the
// agent's --local-prefix). Other documents are not looked at.
// The CEL itself is judged by a real API server in the policy tests.
func CheckLocalNamesPolicy(docs [][]byte, prefix string) []error {
	var errs []error
	policies := map[string]policy{}
	bindings := map[string]policy{}
	for _, doc := range docs {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return []error{err}
		}
		if (head.Kind != "ValidatingAdmissionPolicy" && head.Kind != "ValidatingAdmissionPolicyBinding") ||
			!strings.HasPrefix(head.Metadata.Name, "gpupin-local-names") {
			continue
		}
		var p policy
		if err := yaml.UnmarshalStrict(doc, &p); err != nil {
			return []error{err}
		}
		if p.APIVersion != "admissionregistration.k8s.io/v1" {
			errs = append(errs, fmt.Errorf("%s %s: apiVersion %s", p.Kind, p.Metadata.Name, p.APIVersion))
		}
		if p.Kind == "ValidatingAdmissionPolicy" {
			policies[p.Metadata.Name] = p
		} else {
			bindings[p.Spec.PolicyName] = p
		}
	}
	quoted := "'" + prefix + "/'"
	for _, tc := range []struct {
		name      string
		resources []string
		spec      string // where the pod spec is
	}{
		{"gpupin-local-names-pods", []string{"pods"}, "object.spec."},
		{"gpupin-local-names-templates", []string{"deployments", "daemonsets", "statefulsets", "replicasets", "jobs"}, "object.spec.template.spec."},
	} {
		fail := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf(tc.name+": "+format, a...))
		}
		p, ok := policies[tc.name]
		if !ok {
			fail("no such policy")
			continue
		}
		if b, ok := bindings[tc.name]; !ok || len(b.Spec.ValidationAction) != 1 || b.Spec.ValidationAction[0] != "Deny" {
			fail("binding %+v; want validationActions [Deny]", b.Spec)
		}
		if p.Spec.FailurePolicy != "Fail" {
			fail("failurePolicy %q, want Fail", p.Spec.FailurePolicy)
		}
		var matched []string
		for _, r := range p.Spec.MatchConstraints.ResourceRules {
			if !slices.Contains(r.Operations, "CREATE") || !slices.Contains(r.Operations, "UPDATE") {
				fail("rule %+v: want CREATE and UPDATE", r)
			}
			matched = append(matched, r.Resources...)
		}
		slices.Sort(matched)
		want := slices.Clone(tc.resources)
		slices.Sort(want)
		if !slices.Equal(matched, want) {
			fail("matches %v, want %v", matched, want)
		}
		if len(p.Spec.Variables) != 1 || len(p.Spec.Validations) != 1 {
			fail("variables %+v, validations %+v: want one of each", p.Spec.Variables, p.Spec.Validations)
			continue
		}
		v := p.Spec.Variables[0]
		for _, s := range []string{tc.spec + "containers", tc.spec + "initContainers", "startsWith(" + quoted + ")", "'Never'", "imagePullPolicy"} {
			if !strings.Contains(v.Expression, s) {
				fail("variable %s lacks %q: %s", v.Name, s, v.Expression)
			}
		}
		val := p.Spec.Validations[0]
		if !strings.Contains(val.Expression, "variables."+v.Name) || !strings.Contains(val.MessageExpression, "imagePullPolicy: Never") || val.Reason != "Invalid" {
			fail("validation %+v", val)
		}
		for _, e := range []string{v.Expression, val.Expression, val.MessageExpression} {
			if strings.Count(e, "(") != strings.Count(e, ")") || strings.Count(e, "'")%2 != strings.Count(e, `\'`)%2 {
				fail("unbalanced expression: %s", e)
			}
		}
	}
	return errs
}
