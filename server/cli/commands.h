// kvserve's subcommands. Each takes the arguments after its name and returns
// the process exit code (0 ok, 1 runtime failure, 2 bad usage).
#pragma once

namespace kvserve::cli {

int RunGenerate(int argc, char** argv);      // server/cli/generate.cc
int RunConvert(int argc, char** argv);       // server/cli/convert.cc
int RunServe(int argc, char** argv);         // server/cli/serve.cc
int RunEvalKv(int argc, char** argv);        // server/cli/eval_kv.cc
int RunPlan(int argc, char** argv);          // server/cli/plan.cc
int RunTrainEvictor(int argc, char** argv);  // server/cli/train_evictor.cc
int RunCalibrateKv(int argc, char** argv);   // server/cli/calibrate_kv.cc

}  // namespace kvserve::cli
