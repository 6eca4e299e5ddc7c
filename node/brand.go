package node

// brandNames are NVML's brand types under the names libnvidia-container
// uses in `brand=` constraints of NVIDIA_REQUIRE_* variables.
var brandNames = map[int]string{
	0: "unknown", 1: "quadro", 2: "tesla", 3: "nvs", 4: "grid", 5: "geforce",
	6: "titan", 7: "vapps", 8: "vpc", 9: "vcs", 10: "vws", 11: "cloudgaming",
	12: "quadrortx", 13: "nvidiartx", 14: "nvidia", 15: "geforcertx", 16: "titanrtx",
}

// BrandName maps nvmlBrandType_t to its constraint name.
func BrandName(b int) string {
	if n, ok := brandNames[b]; ok {
		return n
	}
	return "unknown"
}
