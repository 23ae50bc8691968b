// deploy/k8s against the Kubernetes API schemas: both kustomizations (cpu,
// cuda) rendered, every object they produce and the autoscaling examples
// validated by tests/deploy/validate.mjs (kubernetes-models' JSON schemas for
// types, required fields and enums; TypeScript's excess-property check on the
// same API types for unknown fields). Then the same manifests with one
// mistake each must fail, naming the mistake: a misspelled field, a value
// outside an enum, a string where the API wants an integer, an unknown
// kustomization key. Where kubectl is installed, its built-in kustomize must
// render the same objects as validate.mjs's renderer.
//
// Needs node and npm (Debian packages nodejs, npm); the validator's packages
// are pinned in tests/deploy/package-lock.json and installed into a scratch
// folder.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

// `text` with the first occurrence of `from` replaced; fails when absent, so
// a manifest edit cannot silently turn a negative case into a no-op.
std::string ReplaceFirst(std::string text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from);
  INFO("looking for: " << from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST_CASE("Deploy: the Kubernetes manifests pass the API schemas, with no unknown field",
          "[deploy][npm]") {
  testing::NpmWorkdir npm("tests/deploy",
                          {"package.json", "package-lock.json", "validate.mjs", "render.mjs"},
                          "deploy-manifests");
  if (!npm.has_node()) {
    WARN("node/npm not installed (Debian packages nodejs, npm): skipping");
    return;
  }
  {
    INFO("npm ci:\n" << npm.log());
    REQUIRE(npm.Install());
  }
  const std::string validate = "node " + testing::ShellQuote(npm.dir() + "/validate.mjs");
  const std::string in_source = "cd " + testing::ShellQuote(KVSERVE_SOURCE_DIR) + " && ";

  // Every object of both variants and the autoscaling examples.
  {
    std::string out;
    const int rc =
        testing::RunShell(in_source + validate +
                              " deploy/k8s/cpu deploy/k8s/cuda deploy/k8s/autoscaling/hpa.yaml"
                              " deploy/k8s/autoscaling/prometheus-adapter-config.yaml 2>&1",
                          &out);
    INFO(out);
    REQUIRE(rc == 0);
    REQUIRE(out ==
            "ok  deploy/k8s/base/service.yaml  Service/kvserve\n"
            "ok  deploy/k8s/base/service.yaml  Service/kvserve-pods\n"
            "ok  deploy/k8s/base/pvc.yaml  PersistentVolumeClaim/kvserve-models\n"
            "ok  deploy/k8s/base/pdb.yaml  PodDisruptionBudget/kvserve\n"
            "ok  deploy/k8s/cpu/configmap.yaml  ConfigMap/kvserve-config\n"
            "ok  deploy/k8s/cpu/model-loader.yaml  Job/kvserve-model-loader\n"
            "ok  deploy/k8s/cpu/deployment.yaml  Deployment/kvserve\n"
            "ok  deploy/k8s/base/service.yaml  Service/kvserve\n"
            "ok  deploy/k8s/base/service.yaml  Service/kvserve-pods\n"
            "ok  deploy/k8s/base/pvc.yaml  PersistentVolumeClaim/kvserve-models\n"
            "ok  deploy/k8s/base/pdb.yaml  PodDisruptionBudget/kvserve\n"
            "ok  deploy/k8s/cuda/configmap.yaml  ConfigMap/kvserve-config\n"
            "ok  deploy/k8s/cuda/model-loader.yaml  Job/kvserve-model-loader\n"
            "ok  deploy/k8s/cuda/deployment.yaml  Deployment/kvserve\n"
            "ok  deploy/k8s/autoscaling/hpa.yaml  HorizontalPodAutoscaler/kvserve\n"
            "ok  deploy/k8s/autoscaling/prometheus-adapter-config.yaml  ConfigMap/adapter-config\n"
            "16 objects, 0 errors\n");
  }

  // The shared KV tier's overlay, applied beside a variant (docs/kv-tiers.md).
  {
    std::string out;
    const int rc = testing::RunShell(in_source + validate + " deploy/k8s/redis 2>&1", &out);
    INFO(out);
    REQUIRE(rc == 0);
    REQUIRE(out ==
            "ok  deploy/k8s/redis/deployment.yaml  Deployment/kvserve-redis\n"
            "ok  deploy/k8s/redis/service.yaml  Service/kvserve-redis\n"
            "2 objects, 0 errors\n");
  }

  // The rendered images: registry and tag from each kustomization's `images`.
  {
    std::string out;
    REQUIRE(testing::RunShell(
                in_source + "node --input-type=module -e " +
                    testing::ShellQuote(
                        "import { renderKustomization } from " + std::string("'") + npm.dir() +
                        "/render.mjs';\n"
                        "for (const v of ['cpu', 'cuda']) for (const {obj} of "
                        "renderKustomization('deploy/k8s/' + v)) {\n"
                        "  const s = obj.spec?.template?.spec;\n"
                        "  for (const c of [...(s?.initContainers ?? []), ...(s?.containers ?? "
                        "[])]) console.log(v, obj.kind, c.name, c.image, c.imagePullPolicy);\n"
                        "}") +
                    " 2>&1",
                &out) == 0);
    REQUIRE(out ==
            "cpu Job fetch docker.io/curlimages/curl:8.11.1 IfNotPresent\n"
            "cpu Deployment wait-for-model registry.example.com/kvserve:0.1.0-cpu IfNotPresent\n"
            "cpu Deployment kvserve registry.example.com/kvserve:0.1.0-cpu IfNotPresent\n"
            "cuda Job fetch docker.io/library/python:3.12-slim-bookworm IfNotPresent\n"
            "cuda Deployment wait-for-model registry.example.com/kvserve:0.1.0-cuda IfNotPresent\n"
            "cuda Deployment kvserve registry.example.com/kvserve:0.1.0-cuda IfNotPresent\n");
  }

  // One mistake each, in copies of the shipped files.
  {
    const fs::path bad = testing::MakeTempDir("deploy-bad-manifests");
    const std::string deployment =
        testing::ReadFileOrDie(std::string(KVSERVE_SOURCE_DIR) + "/deploy/k8s/cpu/deployment.yaml");
    WriteFile(bad / "misspelled.yaml",
              ReplaceFirst(deployment, "          readinessProbe:", "          readinesProbe:"));
    WriteFile(bad / "nested-misspelled.yaml",
              ReplaceFirst(deployment, "      topologySpreadConstraints:\n        - maxSkew: 1",
                           "      topologySpreadConstraints:\n        - maxSkw: 1"));
    WriteFile(bad / "enum.yaml", ReplaceFirst(deployment, "whenUnsatisfiable: DoNotSchedule",
                                              "whenUnsatisfiable: DontSchedule"));
    WriteFile(bad / "type.yaml", ReplaceFirst(deployment, "terminationGracePeriodSeconds: 45",
                                              "terminationGracePeriodSeconds: \"45\""));
    // A kustomization with a misspelled key (image: for images:).
    fs::copy(fs::path(KVSERVE_SOURCE_DIR) / "deploy/k8s", bad / "k8s", fs::copy_options::recursive);
    WriteFile(bad / "k8s/cpu/kustomization.yaml",
              ReplaceFirst(testing::ReadFileOrDie(bad / "k8s/cpu/kustomization.yaml"),
                           "\nimages:", "\nimage:"));

    std::string out;
    const int rc = testing::RunShell("cd " + testing::ShellQuote(bad.string()) + " && " + validate +
                                         " misspelled.yaml nested-misspelled.yaml enum.yaml"
                                         " type.yaml k8s/cpu 2>&1",
                                     &out);
    INFO(out);
    REQUIRE(rc == 1);
    REQUIRE(
        out ==
        "error  k8s/cpu  -  : k8s/cpu/kustomization.yaml: unknown field \"image\"\n"
        "error  nested-misspelled.yaml  Deployment/kvserve  : data/spec/template/spec/"
        "topologySpreadConstraints/0 must have required property maxSkew\n"
        "error  enum.yaml  Deployment/kvserve  : data/spec/template/spec/"
        "topologySpreadConstraints/0/whenUnsatisfiable must be equal to one of the allowed "
        "values\n"
        "error  type.yaml  Deployment/kvserve  : data/spec/template/spec/"
        "terminationGracePeriodSeconds must be integer\n"
        "error  misspelled.yaml  Deployment/kvserve  "
        "spec.template.spec.containers[0].readinesProbe: unknown field \"readinesProbe\"\n"
        "error  nested-misspelled.yaml  Deployment/kvserve  "
        "spec.template.spec.topologySpreadConstraints[0].maxSkw: unknown field \"maxSkw\"\n"
        "error  enum.yaml  Deployment/kvserve  "
        "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable: Type "
        "'\"DontSchedule\"' is not assignable to type '\"DoNotSchedule\" | \"ScheduleAnyway\"'. "
        "Did you mean '\"DoNotSchedule\"'?\n"
        "error  type.yaml  Deployment/kvserve  spec.template.spec.terminationGracePeriodSeconds: "
        "Type 'string' is not assignable to type 'number'.\n"
        "4 objects, 8 errors\n");
  }

  // kubectl's own kustomize renders the same objects.
  std::string kubectl;
  if (testing::RunShell("command -v kubectl", &kubectl) != 0) {
    WARN("kubectl not installed: render.mjs not compared with kubectl kustomize");
    return;
  }
  std::string out;
  const int rc = testing::RunShell(
      in_source + validate + " --kubectl kubectl deploy/k8s/cpu deploy/k8s/cuda 2>&1", &out);
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.rfind("same as kubectl kustomize  deploy/k8s/cpu  7 objects\n"
                    "same as kubectl kustomize  deploy/k8s/cuda  7 objects\n",
                    0) == 0);
}

}  // namespace
}  // namespace kvserve
